package orchestrator

import "github.com/agentenv/agentenv/internal/failpoint"

// The orchestrator's fault points, one between every two durable steps of a
// state transition (see the package doc's durability rules). The crash
// matrix (api/e2e) kills aenvd at each one and checks recovery. The
// pause's and the snapshot's capture points are package lifecycle's
// (lifecycle/pause.go, lifecycle/snapshot.go); the memory images' points (orchestrator/flatten/written, .../compact/merged,
// .../template/memory-imported) are package memimage's.
var (
	fpCreateDisk     = failpoint.New("orchestrator/create/disk")         // the root disk device exists
	fpCreateRestored = failpoint.New("orchestrator/create/restored")     // the VMM runs, not yet recorded
	fpCreateVMM      = failpoint.New("orchestrator/create/vmm-recorded") // the VMM's pid is recorded

	// A create from the warm pool (pool.go), between the first record and
	// the bring-up; the warm pool's own points are warmpool/...
	fpPoolClaimed  = failpoint.New("orchestrator/pool/claimed")  // the "starting" record names the entry's VMM and device
	fpPoolAssigned = failpoint.New("orchestrator/pool/assigned") // the device is the sandbox's; the entry's record remains

	// A resume from the warm pool (poolresume.go), before the claim above.
	fpPoolRebased = failpoint.New("orchestrator/poolresume/rebased") // the entry's device reads as the sandbox's disk; nothing recorded

	fpResumeRestored = failpoint.New("orchestrator/resume/restored") // the VMM runs, not yet recorded
	fpResumeBooted   = failpoint.New("orchestrator/resume/booted")   // a cold resume's VMM boots the disk, not yet recorded

	fpSnapshotStored = failpoint.New("orchestrator/snapshot/stored") // the snapshot record is durable

	fpDropRecorded = failpoint.New("orchestrator/dropcopy/recorded") // a stale copy's "killing" is durable, nothing removed yet

	fpCompactRootfs = failpoint.New("orchestrator/compact/rootfs-merged") // merged disk layer and its config written, record not yet
)
