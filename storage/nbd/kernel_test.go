//go:build linux

package nbd

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// TestAttachKernel attaches an export to the kernel NBD driver, writes
// through /dev/nbdN and reads the backend. It runs where the nbd module is
// loaded (the kernel lane); the development kernel has none.
func TestAttachKernel(t *testing.T) {
	if err := KernelAvailable(); err != nil {
		t.Skipf("kernel NBD unavailable: %v", err)
	}
	b := NewMem(16 << 20)
	srv := NewServer(Options{})
	if err := srv.Add(Export{Name: "k", Backend: b}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kd, err := AttachKernel(ctx, srv, "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer kd.Detach()
	f, err := os.OpenFile(kd.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("kernel!!"), 512)
	if _, err := f.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got := make([]byte, len(want))
	b.ReadAt(got, 1<<20)
	if !bytes.Equal(got, want) {
		t.Fatal("write through /dev/nbdN did not reach the backend")
	}
}
