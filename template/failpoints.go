package template

import "github.com/agentenv/agentenv/internal/failpoint"

// The fault points of a template's commit, between its durable steps. A
// crash at either leaves the build "building" in its record; the next start
// marks it failed, and the node's sweep removes its VMM and device. The
// template's memory import after the commit is the orchestrator's point
// (orchestrator/template/memory-imported). template/build_test.go kills
// aenvd at each.
var (
	fpCommitSnapshotted = failpoint.New("template/commit/snapshotted") // the VM snapshot is durable, the disk not sealed
	fpCommitSealed      = failpoint.New("template/commit/sealed")      // the disk is a sealed layer, the record not yet ready
)
