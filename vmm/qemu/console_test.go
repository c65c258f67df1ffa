package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestConsoleCapped: a writer appending to the console without end (a
// guest flooding its serial port) leaves at most the cap plus the kept
// tail on disk, and the newest bytes survive the rotation.
func TestConsoleCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	w, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	exited, stop := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	const limit = 64 << 10
	go func() {
		defer close(done)
		capConsole(path, limit, 5*time.Millisecond, exited, stop)
	}()
	line := bytes.Repeat([]byte("x"), 1023)
	line = append(line, '\n')
	for i := 0; i < 4096; i++ { // 4 MiB
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		if i%256 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	w.WriteString("the last line\n")
	time.Sleep(50 * time.Millisecond)
	close(stop)
	<-done
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	if total := len(cur) + len(old); total > limit+keepConsole+len(line)*300 {
		t.Fatalf("console files hold %d bytes after a 4 MiB flood (cap %d + %d kept)", total, limit, keepConsole)
	}
	if !bytes.HasSuffix(cur, []byte("the last line\n")) && !bytes.HasSuffix(old, []byte("the last line\n")) {
		t.Fatalf("the newest console line is lost (current %d bytes, rotated %d)", len(cur), len(old))
	}
	if len(old) == 0 {
		t.Fatal("no rotation happened")
	}
}
