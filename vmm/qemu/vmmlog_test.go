package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestVMMLogCapped: QEMU's log, opened as start opens it and written
// without end through that descriptor (a guest making QEMU warn), is
// rotated by the machine's cap like the console: its files hold at most
// the cap plus the kept tail, in size and in allocated blocks, and a write
// after a truncation lands at the file's start (no hole of the old
// length before it).
func TestVMMLogCapped(t *testing.T) {
	dir := t.TempDir()
	m := &machine{rd: &runDir{dir: dir, console: filepath.Join(dir, "console.log")}, exited: make(chan struct{})}
	path := m.rd.path("qemu.log")
	w, err := openVMMLog(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		capFiles(m.cappedFiles(), 5*time.Millisecond, m.exited, stop)
	}()
	line := append(bytes.Repeat([]byte("w"), 1023), '\n')
	for i := 0; i < 6<<10; i++ { // 6 MiB
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		if i%256 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond) // a rotation of what the flood left
	close(stop)
	<-done
	// QEMU's next write after the last truncation lands at the file's
	// start, not at its old offset.
	w.WriteString("the last warning\n")
	slack := int64(len(line)) * 512 // what arrives between two checks
	var total, blocks int64
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			continue // no rotation: the size check below tells
		}
		total += st.Size()
		blocks += st.Sys().(*syscall.Stat_t).Blocks * 512
	}
	if limit := int64(maxVMMLog+keepConsole) + slack; total > limit || blocks > limit+1<<20 {
		t.Fatalf("qemu.log files hold %d bytes (%d allocated) after a 6 MiB flood, want at most %d", total, blocks, limit)
	}
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	if !bytes.HasSuffix(cur, []byte("the last warning\n")) || len(old) == 0 {
		t.Fatalf("the newest line of qemu.log is lost or nothing was rotated (current %d bytes, rotated %d)", len(cur), len(old))
	}
	if i := bytes.IndexByte(cur, 0); i >= 0 {
		t.Fatalf("qemu.log holds a hole of zeros at %d: QEMU wrote past the truncation", i)
	}
}
