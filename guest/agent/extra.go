package agent

import (
	"github.com/agentenv/agentenv/guest/agent/files"
	"github.com/agentenv/agentenv/guest/agent/fssvc"
	"github.com/agentenv/agentenv/guest/agent/gen/filesystem/filesystemconnect"
)

// mountExtra adds the filesystem service and /files.
func (a *Agent) mountExtra() {
	a.mux.Handle(filesystemconnect.NewFilesystemHandler(fssvc.New(a.st, a.log), a.rpcOptions()...))
	a.mux.Handle("/files", files.New(a.st, a.log))
}
