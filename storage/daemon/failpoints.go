package daemon

import "github.com/agentenv/agentenv/internal/failpoint"

// Failpoints at every step of the daemon's state transitions. Each sits
// just after the step its name says is done, so a crash there leaves the
// state directory exactly between two steps; recovery must then finish or
// undo the operation. failpoint.Names("storaged/") lists them for the crash
// matrix test.
var (
	// create (also the warm pool's refill, which makes devices the same way)
	fpCreateAfterDir    = failpoint.New("storaged/create/after-dir")    // device directory made, no files yet
	fpCreateAfterConfig = failpoint.New("storaged/create/after-config") // upper and config durable, not exported
	fpCreateAfterExport = failpoint.New("storaged/create/after-export") // exported, no record
	fpCreateAfterRecord = failpoint.New("storaged/create/after-record") // record durable, not yet answered

	// delete
	fpDeleteAfterStop   = failpoint.New("storaged/delete/after-stop")   // export stopped, record still in place
	fpDeleteAfterUnlink = failpoint.New("storaged/delete/after-unlink") // directory moved to the trash, not removed

	// restack (see restack.go for the steps)
	fpRestackAfterIntent  = failpoint.New("storaged/restack/after-intent")  // journal says "begun"
	fpRestackAfterSeal    = failpoint.New("storaged/restack/after-seal")    // sealed layer durable
	fpRestackAfterConfig  = failpoint.New("storaged/restack/after-config")  // next generation's config durable
	fpRestackAfterRecord  = failpoint.New("storaged/restack/after-record")  // record names the new generation
	fpRestackAfterCleanup = failpoint.New("storaged/restack/after-cleanup") // old generation removed, journal left

	// reclaim: after each device it deleted or released
	fpReclaimAfterDelete  = failpoint.New("storaged/reclaim/after-delete")
	fpReclaimAfterRelease = failpoint.New("storaged/reclaim/after-release")

	// warm pool
	fpWarmAfterSave     = failpoint.New("storaged/warm/after-save")     // pool.json durable, refill not started
	fpPoolAfterFill     = failpoint.New("storaged/pool/after-fill")     // pool device made, not yet in the ready list
	fpPoolAfterClaim    = failpoint.New("storaged/pool/after-claim")    // pool device recorded as the caller's, not answered
	fpSharedAfterRecord = failpoint.New("storaged/shared/after-record") // a holder added or dropped in the record
)
