//go:build linux

package nbd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/Merovius/nbd/nbdnl"
)

// KernelDevice is an export attached to the Linux NBD driver as /dev/nbdN,
// for consumers that need a block device path (Firecracker, mounts).
type KernelDevice struct {
	Index uint32
	Path  string
}

// KernelAvailable returns nil when the kernel's NBD driver can be driven over
// netlink, or why not. Hosts without the nbd module (our CI kernel) have
// exports over sockets only.
func KernelAvailable() error {
	if _, err := os.Stat("/sys/module/nbd"); err != nil {
		return fmt.Errorf("nbd kernel module not loaded (modprobe nbd): %w", err)
	}
	if _, err := nbdnl.StatusAll(); err != nil {
		return fmt.Errorf("nbd netlink interface: %w", err)
	}
	return nil
}

// AttachKernel serves export from srv over conns private socket pairs and
// hands their client ends, already past the handshake, to the kernel
// (github.com/Merovius/nbd/nbdnl does the netlink part). The device goes away
// with Detach, or when srv stops serving the export.
func AttachKernel(ctx context.Context, srv *Server, export string, conns int) (*KernelDevice, error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close() // the kernel keeps its own references to the sockets
		}
	}()
	var info ExportInfo
	for range max(conns, 1) {
		f, i, err := kernelConn(ctx, srv, export)
		if err != nil {
			return nil, err
		}
		files, info = append(files, f), i
	}
	idx, err := nbdnl.Connect(nbdnl.IndexAny, files, uint64(info.Size), 0, nbdnl.ServerFlags(info.Flags), nbdnl.WithBlockSize(4096))
	if err != nil {
		return nil, fmt.Errorf("attach %q to the kernel nbd driver: %w", export, err)
	}
	return &KernelDevice{Index: idx, Path: fmt.Sprintf("/dev/nbd%d", idx)}, nil
}

// kernelConn makes one socket pair: the server end is served by srv, the
// client end is negotiated here and returned for the kernel.
func kernelConn(ctx context.Context, srv *Server, export string) (*os.File, ExportInfo, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, ExportInfo{}, fmt.Errorf("attach %q: socketpair: %w", export, err)
	}
	client, server := os.NewFile(uintptr(fds[0]), "nbd-kernel"), os.NewFile(uintptr(fds[1]), "nbd-server")
	sc, err := net.FileConn(server)
	server.Close()
	if err != nil {
		client.Close()
		return nil, ExportInfo{}, fmt.Errorf("attach %q: %w", export, err)
	}
	go srv.ServeConn(ctx, sc)
	hc, err := net.FileConn(client) // a dup, only for the handshake
	if err != nil {
		client.Close()
		return nil, ExportInfo{}, fmt.Errorf("attach %q: %w", export, err)
	}
	info, err := Negotiate(ctx, hc, export)
	hc.Close()
	if err != nil {
		client.Close()
		return nil, ExportInfo{}, err
	}
	return client, info, nil
}

// Detach disconnects the kernel device.
func (k *KernelDevice) Detach() error {
	if err := nbdnl.Disconnect(k.Index); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detach %s: %w", k.Path, err)
	}
	return nil
}
