package inherited

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseOnExec: a descriptor opened without close-on-exec (as one
// inherited from a parent is) reaches a child before CloseOnExec and not
// after, and stays usable in this process.
func TestCloseOnExec(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A high number (no descriptor ls opens itself), without close-on-exec.
	const fd = 200
	if err := unix.Dup2(int(f.Fd()), fd); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	childHas := func() bool {
		out, err := exec.Command("ls", "/proc/self/fd").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(" "+strings.Join(strings.Fields(string(out)), " ")+" ", " "+strconv.Itoa(fd)+" ")
	}
	if !childHas() {
		t.Fatalf("a child did not get descriptor %d before CloseOnExec: the test proves nothing", fd)
	}
	if err := CloseOnExec(); err != nil {
		t.Fatal(err)
	}
	if childHas() {
		t.Fatalf("a child still gets descriptor %d", fd)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		t.Fatalf("descriptor %d is no longer usable here: %v", fd, err)
	}
}
