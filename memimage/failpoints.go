package memimage

import "github.com/agentenv/agentenv/internal/failpoint"

// The memory images' fault points, between durable steps. Their names keep
// the node's orchestrator/ prefix: the crash matrix (api/e2e) kills aenvd
// at each one by name and checks recovery.
var (
	fpFlattenWritten   = failpoint.New("orchestrator/flatten/written")          // a paused sandbox's memory is one durable file too
	fpCompactMerged    = failpoint.New("orchestrator/compact/merged")           // merged memory layer written, manifest not yet
	fpTemplateImported = failpoint.New("orchestrator/template/memory-imported") // base memory layer written, manifest not yet
)
