package api

import (
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/sandbox"
)

// createDrives is a create's extra drives (an aenvd extension); the
// orchestrator validates them.
func createDrives(in *[]wire.SandboxDrive) []disk.DriveRequest {
	if in == nil {
		return nil
	}
	out := make([]disk.DriveRequest, 0, len(*in))
	for _, d := range *in {
		out = append(out, disk.DriveRequest{Image: deref(d.Image), SizeMiB: int(deref(d.SizeMiB)), ReadOnly: deref(d.ReadOnly)})
	}
	return out
}

// driveInfo describes a sandbox's drives for GET /sandboxes/{id} (its
// volumes are its volumeMounts).
func driveInfo(drives []sandbox.AttachedDrive) *[]wire.SandboxDriveInfo {
	var out []wire.SandboxDriveInfo
	for _, d := range drives {
		if d.Volume != "" {
			continue
		}
		i := wire.SandboxDriveInfo{Device: sandbox.GuestDisk(d.Slot), ReadOnly: d.ReadOnly}
		if d.Image != "" {
			i.Image = ptr(d.Image)
		}
		if d.SizeMiB > 0 {
			i.SizeMiB = ptr(int32(d.SizeMiB))
		}
		out = append(out, i)
	}
	if out == nil {
		return nil
	}
	return &out
}
