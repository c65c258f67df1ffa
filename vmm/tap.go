package vmm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenTap attaches to (creating if needed) the tap device name in the
// calling thread's network namespace and returns the open /dev/net/tun file
// for a VMM to use. Callers that need a tap in another namespace switch the
// thread into it first (see network).
func OpenTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open tap %s: /dev/net/tun: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap %s: TUNSETIFF: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}
