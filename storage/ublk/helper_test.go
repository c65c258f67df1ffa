//go:build linux

package ublk_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/ublk"
)

// The tests below start this test binary again as a helper process (a
// ublk server that can be killed, a process that maps a device), chosen
// by AENV_UBLK_HELPER.
const helperEnv = "AENV_UBLK_HELPER"

// TestHelperProcess is the helper's body; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		t.Skip("helper process for the device tests")
	case "serve":
		os.Exit(helperServe())
	case "map":
		os.Exit(helperMap())
	}
}

// helper is a running helper process talking over its stdin and stdout.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startHelper(t *testing.T, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { h.cmd.Process.Kill(); h.cmd.Wait() })
	return h
}

// expect reads lines until one starts with prefix and returns the rest.
func (h *helper) expect(t *testing.T, prefix string) string {
	t.Helper()
	for {
		line, err := h.out.ReadString('\n')
		if err != nil {
			t.Fatalf("helper ended before %q: %v", prefix, err)
		}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
}

// helperServe serves the image at AENV_UBLK_CONFIG as a recoverable
// device (or recovers AENV_UBLK_RECOVER), prints "READY <id>" and serves
// until its stdin closes.
func helperServe() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	im, err := image.Open(ctx, os.Getenv("AENV_UBLK_CONFIG"), image.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer im.Close()
	var d *ublk.Device
	if id := os.Getenv("AENV_UBLK_RECOVER"); id != "" {
		n, _ := strconv.Atoi(id)
		d, err = ublk.Recover(ctx, uint32(n), im, ublk.Options{})
	} else {
		d, err = ublk.Create(ctx, im, ublk.Options{Depth: 16, Recovery: true})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("READY %d\n", d.ID)
	io.Copy(io.Discard, os.Stdin)
	if err := d.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// helperMap maps the first AENV_UBLK_LEN bytes of the device
// AENV_UBLK_DEV privately, checks they hash to AENV_UBLK_SUM and prints
// "READ"; on a line from stdin fills every byte with AENV_UBLK_FILL and
// prints "WROTE"; on the next line checks it still sees only its own bytes
// and prints "OK".
func helperMap() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "map helper:", err); return 1 }
	n, _ := strconv.Atoi(os.Getenv("AENV_UBLK_LEN"))
	fill := os.Getenv("AENV_UBLK_FILL")[0]
	f, err := os.Open(os.Getenv("AENV_UBLK_DEV"))
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		return fail(err)
	}
	if got := fmt.Sprintf("%x", sha256Sum(m)); got != os.Getenv("AENV_UBLK_SUM") {
		return fail(fmt.Errorf("mapping reads %s, want the device's %s", got, os.Getenv("AENV_UBLK_SUM")))
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("READ")
	in.ReadString('\n')
	for i := range m {
		m[i] = fill
	}
	fmt.Println("WROTE")
	in.ReadString('\n')
	for i, b := range m {
		if b != fill {
			return fail(fmt.Errorf("byte %d is %#x, want our own %#x", i, b, fill))
		}
	}
	fmt.Println("OK")
	return 0
}
