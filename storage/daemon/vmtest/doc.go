// Package vmtest holds the storage daemon's end-to-end test with a real QEMU
// VM booting its root filesystem from a daemon device. It is a package of its
// own so that the daemon's unit tests do not depend on the vmm layer building.
package vmtest
