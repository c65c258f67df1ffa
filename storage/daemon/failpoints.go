package daemon

import (
	"sync/atomic"

	"github.com/agentenv/agentenv/internal/failpoint"
)

// point is a failpoint that tests can also stop at (stepHook), to look at
// the state directory between two steps without killing the process.
type point struct{ *failpoint.Point }

func newPoint(name string) point { return point{failpoint.New(name)} }

// stepHook, when set, runs at every point before its action.
var stepHook atomic.Pointer[func(name string)]

// Inject runs the test hook, then the point's action.
func (p point) Inject() error {
	if h := stepHook.Load(); h != nil {
		(*h)(p.Name())
	}
	return p.Point.Inject()
}

// Failpoints at every step of the daemon's state transitions. Each sits
// just after the step its name says is done, so a crash there leaves the
// state directory exactly between two steps; recovery must then finish or
// undo the operation. failpoint.Names("storaged/") lists them for the crash
// matrix test.
var (
	// create (also the warm pool's refill, which makes devices the same way)
	fpCreateAfterDir    = newPoint("storaged/create/after-dir")    // device directory made, no files yet
	fpCreateAfterConfig = newPoint("storaged/create/after-config") // upper and config durable, not exported
	fpCreateAfterExport = newPoint("storaged/create/after-export") // exported, no record
	fpCreateAfterRecord = newPoint("storaged/create/after-record") // record durable, not yet answered

	// delete
	fpDeleteAfterStop   = newPoint("storaged/delete/after-stop")   // export stopped, record still in place
	fpDeleteAfterUnlink = newPoint("storaged/delete/after-unlink") // directory moved to the trash, not removed

	// restack (see restack.go for the steps)
	fpRestackAfterIntent  = newPoint("storaged/restack/after-intent")  // journal says "begun"
	fpRestackAfterSeal    = newPoint("storaged/restack/after-seal")    // sealed layer durable
	fpRestackAfterConfig  = newPoint("storaged/restack/after-config")  // next generation's config durable
	fpRestackAfterRecord  = newPoint("storaged/restack/after-record")  // record names the new generation
	fpRestackAfterCleanup = newPoint("storaged/restack/after-cleanup") // old generation removed, journal left

	// a seal that keeps the device's upper (RestackParams.Keep): a restack
	// of its own, passing none of the points above
	fpSealAfterLayer = newPoint("storaged/seal/after-layer") // sealed layer durable, device unchanged, not answered

	// localize (see localize.go)
	fpLocalizeAfterConfig = newPoint("storaged/localize/after-config") // the config naming the files durable, record not yet
	fpLocalizeAfterRecord = newPoint("storaged/localize/after-record") // record names the files, the export still reads the URLs

	// rebase (see rebase.go)
	fpRebaseAfterConfig = newPoint("storaged/rebase/after-config") // the new generation durable, record not yet
	fpRebaseAfterRecord = newPoint("storaged/rebase/after-record") // record names the new generation, the export still serves the old

	// reclaim: after each device it deleted or released
	fpReclaimAfterDelete  = newPoint("storaged/reclaim/after-delete")
	fpReclaimAfterRelease = newPoint("storaged/reclaim/after-release")

	// warm pool
	fpWarmAfterSave     = newPoint("storaged/warm/after-save")     // pool.json durable, refill not started
	fpPoolAfterFill     = newPoint("storaged/pool/after-fill")     // pool device made, not yet in the ready list
	fpPoolAfterClaim    = newPoint("storaged/pool/after-claim")    // pool device recorded as the caller's, not answered
	fpSharedAfterRecord = newPoint("storaged/shared/after-record") // a holder added or dropped in the record

	// a FUSE mount of shared memory taken over from a killed daemon: its
	// exports added back, nothing served yet (outside "storaged/": the
	// crash matrix's scenario has no FUSE mount; TestCrashFUSEMapping
	// crashes here)
	fpFUSETakenOver = newPoint("storaged-fuse/taken-over")
)
