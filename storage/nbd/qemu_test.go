package nbd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Missing(t, "%s not installed (Debian qemu-utils / libnbd-bin): %v", name, err)
	}
	return p
}

func nbdURI(sock, export string) string { return "nbd+unix:///" + export + "?socket=" + sock }

// randomSparse writes n random extents into w and the same bytes into want.
func randomSparse(r *rand.Rand, want []byte, w interface {
	WriteAt([]byte, int64) (int, error)
}, n int) {
	for range n {
		l := 512 + r.IntN(64<<10)
		off := r.IntN(len(want) - l)
		p := make([]byte, l)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		w.WriteAt(p, int64(off))
		copy(want[off:], p)
	}
}

// TestQemuImgCompare has QEMU's NBD client read the whole export and compare
// it with a raw file holding the expected content, then checks that a one-byte
// difference is noticed (so the comparison can fail).
func TestQemuImgCompare(t *testing.T) {
	t.Parallel()
	qimg := needTool(t, "qemu-img")
	const size = 16 << 20
	want := make([]byte, size)
	b := fileBackend(t, size)
	randomSparse(rand.New(rand.NewPCG(1, 2)), want, b, 64)
	_, sock := serve(t, "unix", Export{Name: "disk", Backend: b, ReadOnly: true})
	expected := filepath.Join(t.TempDir(), "expected.raw")
	if err := os.WriteFile(expected, want, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(qimg, "compare", "-f", "raw", "-F", "raw", expected, nbdURI(sock, "disk")).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img compare: %v\n%s", err, out)
	}
	want[size/2] ^= 0xff
	if err := os.WriteFile(expected, want, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(qimg, "compare", "-f", "raw", "-F", "raw", expected, nbdURI(sock, "disk")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("qemu-img compare of differing images: %v (want exit 1)\n%s", err, out)
	}
}

// TestQemuIoWriteReadBack has qemu-io write random patterned extents, then
// read them back with pattern verification, and checks the backend directly.
func TestQemuIoWriteReadBack(t *testing.T) {
	t.Parallel()
	qio := needTool(t, "qemu-io")
	const size = 32 << 20
	b := NewMem(size)
	_, sock := serve(t, "unix", Export{Name: "disk", Backend: b})
	r := rand.New(rand.NewPCG(3, 4))
	type extent struct {
		off, n  int
		pattern byte
	}
	// Disjoint 1 MiB slots so later writes do not overwrite earlier patterns.
	var exts []extent
	for slot := range 32 {
		if r.IntN(2) == 0 {
			continue
		}
		exts = append(exts, extent{slot<<20 + 512*r.IntN(256), 512 * (1 + r.IntN(1024)), byte(1 + r.IntN(254))})
	}
	var args []string
	for _, e := range exts {
		args = append(args, "-c", fmt.Sprintf("write -P %d %d %d", e.pattern, e.off, e.n))
	}
	args = append(args, "-c", "flush", "-c", fmt.Sprintf("write -z %d 4096", 31<<20))
	for _, e := range exts {
		args = append(args, "-c", fmt.Sprintf("read -P %d %d %d", e.pattern, e.off, e.n))
	}
	args = append(args, "-f", "raw", nbdURI(sock, "disk"))
	out, err := exec.Command(qio, args...).CombinedOutput()
	if err != nil || bytes.Contains(bytes.ToLower(out), []byte("fail")) {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	if got := strings.Count(string(out), "read "); got != len(exts) {
		t.Fatalf("qemu-io reported %d reads, want %d:\n%s", got, len(exts), out)
	}
	for _, e := range exts {
		got := make([]byte, e.n)
		b.ReadAt(got, int64(e.off))
		if !bytes.Equal(got, bytes.Repeat([]byte{e.pattern}, e.n)) {
			t.Fatalf("backend at %d+%d does not hold pattern %#x", e.off, e.n, e.pattern)
		}
	}
}

// TestNbdinfo checks what libnbd sees of the handshake: size, flags, block sizes.
func TestNbdinfo(t *testing.T) {
	t.Parallel()
	tool := needTool(t, "nbdinfo")
	_, sock := serve(t, "unix", Export{Name: "disk", Description: "test disk", Backend: NewMem(3 << 20), ReadOnly: true})
	out, err := exec.Command(tool, "--json", nbdURI(sock, "disk")).Output()
	if err != nil {
		t.Fatalf("nbdinfo: %v\n%s", err, out)
	}
	var info struct {
		Exports []struct {
			Name         string `json:"export-name"`
			Size         int64  `json:"export-size"`
			ReadOnly     bool   `json:"is_read_only"`
			MultiConn    bool   `json:"can_multi_conn"`
			MaxBlockSize int64  `json:"block_size_maximum"`
			Description  string `json:"description"`
		} `json:"exports"`
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo json %v: %s", err, out)
	}
	e := info.Exports[0]
	if e.Name != "disk" || e.Size != 3<<20 || !e.ReadOnly || !e.MultiConn || e.MaxBlockSize != DefaultMaxPayload || e.Description != "test disk" {
		t.Fatalf("nbdinfo sees %+v", e)
	}
}

// TestNbdcopyMultiConn has libnbd's nbdcopy (which opens several connections
// when the server allows multi-conn) copy a file into a writable export and
// the export back out, and compares the bytes.
func TestNbdcopyMultiConn(t *testing.T) {
	t.Parallel()
	tool := needTool(t, "nbdcopy")
	const size = 24 << 20
	want := make([]byte, size)
	randomSparse(rand.New(rand.NewPCG(5, 6)), want, NewMem(size), 128)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.raw"), filepath.Join(dir, "out.raw")
	if err := os.WriteFile(in, want, 0o600); err != nil {
		t.Fatal(err)
	}
	b := NewMem(size)
	srv, sock := serve(t, "unix", Export{Name: "disk", Backend: b})
	if o, err := exec.Command(tool, "--connections=4", in, nbdURI(sock, "disk")).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v\n%s", err, o)
	}
	if o, err := exec.Command(tool, "--connections=4", nbdURI(sock, "disk"), out).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out: %v\n%s", err, o)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("round trip through the export changed the bytes")
	}
	if n := srv.Transmissions(); n < 2*2 {
		t.Fatalf("nbdcopy made %d connections in two runs; multi-conn not used", n)
	}
}
