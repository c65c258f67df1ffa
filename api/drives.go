package api

import "github.com/agentenv/agentenv/orchestrator"

// createDrives is a create's extra drives (an aenvd extension); the
// orchestrator validates them.
func createDrives(in *[]SandboxDrive) []orchestrator.DriveRequest {
	if in == nil {
		return nil
	}
	out := make([]orchestrator.DriveRequest, 0, len(*in))
	for _, d := range *in {
		out = append(out, orchestrator.DriveRequest{Image: deref(d.Image), SizeMiB: int(deref(d.SizeMiB)), ReadOnly: deref(d.ReadOnly)})
	}
	return out
}
