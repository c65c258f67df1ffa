package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// A drive slot the guest probed at boot was an empty disk; when a restore
// puts a real disk in it, the guest's virtio-blk driver still holds the
// empty one's size and features (read-only among them). /init's drives
// name such disks, and the agent unbinds each from the driver and binds
// it again: the driver resets the device and reads it anew, and the disk
// comes back under its name (the driver takes the lowest free index).

// maxInitDrives bounds /init's drives list (the host has a few slots).
const maxInitDrives = 16

// guestDiskName is what a drive slot's disk is called in the guest.
var guestDiskName = regexp.MustCompile(`^vd[b-z]$`)

// checkDrives validates /init's drives.
func checkDrives(names []string) error {
	if len(names) > maxInitDrives {
		return fmt.Errorf("drives: %d names, at most %d", len(names), maxInitDrives)
	}
	for _, n := range names {
		if !guestDiskName.MatchString(n) {
			return fmt.Errorf("drives: %q is not a drive slot's disk (vdb..vdz)", n)
		}
	}
	return nil
}

// reprobeDisks has the virtio-blk driver probe each named disk again, one
// at a time, and checks that it came back under its name. sys is the sysfs
// mount point.
func reprobeDisks(sys string, names []string) error {
	drv := filepath.Join(sys, "bus", "virtio", "drivers", "virtio_blk")
	for _, n := range names {
		link, err := os.Readlink(filepath.Join(sys, "block", n, "device"))
		if err != nil {
			return fmt.Errorf("drive %s: find its device: %w", n, err)
		}
		dev := filepath.Base(link)
		if err := os.WriteFile(filepath.Join(drv, "unbind"), []byte(dev), 0); err != nil {
			return fmt.Errorf("drive %s: unbind %s: %w", n, dev, err)
		}
		if err := os.WriteFile(filepath.Join(drv, "bind"), []byte(dev), 0); err != nil {
			return fmt.Errorf("drive %s: bind %s: %w", n, dev, err)
		}
		back, err := os.Readlink(filepath.Join(sys, "block", n, "device"))
		if err != nil || filepath.Base(back) != dev {
			return fmt.Errorf("drive %s: %s did not come back under its name: %w", n, dev, errors.Join(err, errors.New("renamed")))
		}
	}
	return nil
}
