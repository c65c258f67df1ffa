package sandbox

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/vmm"
)

// MaxDriveSlots is how many drive slots a VM of a driver that has them
// (vmm.EmptyDriver) gets after its root disk: the guest sees them as
// /dev/vdb../dev/vde. A microvm machine has eight virtio transports; the
// root disk, the NIC and the entropy device take three.
const MaxDriveSlots = 4

// DriveSlots is how many drive slots a cold boot with driver d makes.
func DriveSlots(d vmm.Driver) int {
	if e, ok := d.(vmm.EmptyDriver); ok && e.EmptyDrives() {
		return MaxDriveSlots
	}
	return 0
}

// SlotID is the drive id of slot i (1-based; the guest's vd<'a'+i>).
func SlotID(i int) string { return fmt.Sprintf("drive%d", i) }

// GuestDisk names slot i's disk in the guest ("vdb" for slot 1).
func GuestDisk(i int) string { return "vd" + string(rune('a'+i)) }

// attachDrives attaches every filled slot (registering its detach) and
// returns the slots' drives in order, empty ones as vmm.Drive.Empty.
func attachDrives(ctx context.Context, slots []Disk, as *vmm.Identity, undo *cleanup) ([]vmm.Drive, error) {
	out := make([]vmm.Drive, len(slots))
	for i, d := range slots {
		id := SlotID(i + 1)
		if d == nil {
			out[i] = vmm.Drive{ID: id, Empty: true}
			continue
		}
		drive, err := d.Attach(ctx, as)
		if err != nil {
			return nil, fmt.Errorf("drive %s: %w", id, err)
		}
		undo.add(d.Detach)
		drive.ID = id
		out[i] = drive
	}
	return out, nil
}
