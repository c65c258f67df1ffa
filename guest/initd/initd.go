// Package initd holds the duties of PID 1 inside a sandbox VM: load kernel
// modules, mount the pseudo filesystems, switch from the initramfs to the real
// root, configure the network from the kernel command line, start the agent
// as a supervised child, reap orphans and power the machine off cleanly.
package initd

import "os"

// Main runs PID 1 and never returns.
func Main() {
	os.Exit(1)
}
