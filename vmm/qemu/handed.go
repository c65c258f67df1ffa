package qemu

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// handedFiles are the files QEMU gets as inherited descriptors rather than
// by name: its QMP socket, the console log and the memory file. Its command
// line, which every local user reads in ps, then names no sandbox (their
// paths hold its id), and none of them is opened after QEMU drops
// privileges (vmm.Config.RunAs).
type handedFiles struct {
	qmp, console, memory *os.File
}

// argFDs are the descriptor numbers QEMU finds the handed files at.
type argFDs struct {
	QMP, Console, Memory int
}

// openHanded opens the files of a start: the QMP socket listening at
// qmpSocket (left on disk for a later adopt to connect to), the console
// log in append mode, and the memory file (QEMU maps it as mem says).
func openHanded(qmpSocket, console string, mem memorySource) (_ *handedFiles, err error) {
	h := &handedFiles{}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	_ = os.Remove(qmpSocket)
	ln, err := listenHidden(qmpSocket)
	if err != nil {
		return nil, fmt.Errorf("qmp socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // QEMU serves it from here on
	// The VMM's control channel: root's alone.
	if err := os.Chmod(qmpSocket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("qmp socket: %w", err)
	}
	h.qmp, err = ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("qmp socket: %w", err)
	}
	if h.console, err = os.OpenFile(console, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
		return nil, fmt.Errorf("console log: %w", err)
	}
	// Read-write, as QEMU opens it by name: a private mapping of it stays
	// private all the same.
	if h.memory, err = os.OpenFile(mem.path, os.O_RDWR, 0); err != nil {
		return nil, fmt.Errorf("memory file: %w", err)
	}
	return h, nil
}

// extraFiles appends the handed files to the taps (which start at fd 3)
// and returns where QEMU finds each.
func (h *handedFiles) extraFiles(taps []*os.File) ([]*os.File, argFDs) {
	files := append(append([]*os.File(nil), taps...), h.qmp, h.console, h.memory)
	n := 3 + len(taps)
	return files, argFDs{QMP: n, Console: n + 1, Memory: n + 2}
}

// Close closes our copies (QEMU holds its own once started).
func (h *handedFiles) Close() {
	for _, f := range []*os.File{h.qmp, h.console, h.memory} {
		if f != nil {
			f.Close()
		}
	}
}

// procFD is how QEMU names an inherited descriptor where it wants a path.
func procFD(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// listenHidden listens on a Unix socket at path without path showing in
// /proc/net/unix, which every local user reads: the socket's directory
// names the sandbox, and a sandbox id is a secret (with it a local user
// could reach the sandbox through the proxy). It binds through
// /proc/self/fd/<directory>/<name>, the name the kernel then reports; the
// socket file is at path all the same, where clients connect.
func listenHidden(path string) (*net.UnixListener, error) {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	name := fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	return net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
}
