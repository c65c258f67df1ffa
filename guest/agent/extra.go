package agent

import (
	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/files"
	"github.com/agentenv/agentenv/guest/agent/fssvc"
	"github.com/agentenv/agentenv/guest/agent/gen/filesystem/filesystemconnect"
)

// mountExtra adds the filesystem service and /files.
func (a *Agent) mountExtra() {
	a.mux.Handle(filesystemconnect.NewFilesystemHandler(fssvc.New(a.st, a.log), connect.WithReadMaxBytes(MaxRPCMessage)))
	a.mux.Handle("/files", files.New(a.st, a.log))
}
