package vmmproc

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestMentions: a process is matched by a path it holds open as well as by
// its command line, and a test binary is no VMM.
func TestMentions(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "held-open-marker"))
	if err != nil {
		t.Fatal(err)
	}
	self := "/proc/" + strconv.Itoa(os.Getpid())
	if !Mentions(self, "held-open-marker") {
		t.Error("a file held open is not seen")
	}
	f.Close()
	if Mentions(self, "held-open-marker") {
		t.Error("a closed file is still seen")
	}
	if !Mentions(self, filepath.Base(os.Args[0])) {
		t.Error("the command line is not seen")
	}
	if IsVMM(self) || len(Mentioning(filepath.Base(os.Args[0]))) != 0 {
		t.Error("the test binary counts as a VMM")
	}
}
