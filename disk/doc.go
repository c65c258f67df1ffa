// Package disk is the node's side of block storage: the only package above
// the storage daemon that speaks its RPC types (storage/daemon/rpc), holds
// its client (storage/daemon/client) or reads images (storage/image).
//
// A Manager, made once per node from the daemon's devices (aenv-storaged
// over its socket, or the same daemon run in process: StartLocal), gives
// the node's operations in the node's terms: a root disk or an extra drive
// attached to a VM and detached from it, seals of a device's upper into a
// sealed layer, copies of a disk into a snapshot directory, the disk a
// template boots from, warm pools of root disks, the devices a record
// holds deleted or reclaimed, blank layers of new volumes, shared memory
// devices (memory.go) and the lazy rootfs layers moved onto local files
// (lazy.go).
//
// What the backend can do is asked of it once, in New (Block, Memory):
// nothing above branches on which daemon serves the disks.
package disk
