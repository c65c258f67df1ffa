package uring

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestBrokenRingWaitsForInFlightReads: when io_uring_enter fails after the
// kernel took a read, ReadBatch must not return (its caller would reuse the
// pooled buffer) nor close the ring before the read completed. A read from
// an empty pipe stays in flight until the test writes to the pipe.
func TestBrokenRingWaitsForInFlightReads(t *testing.T) {
	if !Enabled() {
		t.Skip("io_uring is not available here")
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	calls := 0
	enterHook = func(r *ring, toSubmit, minComplete int) (int, syscall.Errno) {
		calls++
		if calls == 1 { // submit, but do not wait for the pipe
			ret, _, errno := syscall.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(toSubmit), 0, enterGetEvents, 0, 0)
			return int(ret), errno
		}
		return 0, syscall.EBADF // the ring is broken from now on
	}
	defer func() { enterHook = nil }()
	buf := make([]byte, 6)
	done := make(chan error, 1)
	go func() { done <- ReadBatch([]Op{{Fd: int(pr.Fd()), Iov: [][]byte{buf}}}) }()
	select {
	case err := <-done:
		t.Fatalf("ReadBatch returned (%v) while its read was still in flight into the caller's buffer", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := pw.Write([]byte("filled")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errRingBroken) {
			t.Fatalf("ReadBatch on a broken ring: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadBatch did not return after its read completed")
	}
	if !bytes.Equal(buf, []byte("filled")) {
		t.Fatalf("buffer %q: the read completed after ReadBatch gave the buffer back", buf)
	}
}
