package daemon

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		testenv.Missing(t, "%s not installed (Debian qemu-utils): %v", name, err)
	}
}

// TestQemuImgCompareDevice: QEMU's NBD client reads a daemon device (a shared
// device and a runtime device) and finds it identical to the expected raw file.
func TestQemuImgCompareDevice(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-img")
	f := newFixture(t, 11)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	raw := filepath.Join(t.TempDir(), "expected.raw")
	if err := os.WriteFile(raw, f.want, 0o600); err != nil {
		t.Fatal(err)
	}
	sh, err := h.c.AcquireShared(ctx, f.config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []rpc.Device{sh, rt} {
		out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", raw, dev.URI).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-img compare %s device: %v\n%s", dev.Kind, err, out)
		}
	}
}

// TestQemuIoRestack: qemu-io writes patterned extents into a device, the
// device is restacked, and qemu-io reads the patterns back through the new
// stack; the sealed layer alone (with the base) holds them too.
func TestQemuIoRestack(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-io")
	f := newFixture(t, 12)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(f.want)
	var writes, reads []string
	for i := range 16 {
		off, n, pat := i*(diskSize/16)+4096*(i%7), 4096*(1+i%5), 0x10+i
		writes = append(writes, "-c", fmt.Sprintf("write -P %d %d %d", pat, off, n))
		reads = append(reads, "-c", fmt.Sprintf("read -P %d %d %d", pat, off, n))
		copy(want[off:off+n], bytes.Repeat([]byte{byte(pat)}, n))
	}
	qemuIO := func(args []string) {
		t.Helper()
		out, err := exec.Command("qemu-io", append(args, "-f", "raw", dev.URI)...).CombinedOutput()
		if err != nil || bytes.Contains(bytes.ToLower(out), []byte("fail")) {
			t.Fatalf("qemu-io: %v\n%s", err, out)
		}
	}
	qemuIO(append(writes, "-c", "flush"))
	res, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatal(err)
	}
	qemuIO(reads)
	im, err := image.OpenLayers(ctx, []string{f.base, res.Layer}, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := readAll(t, im, diskSize); !bytes.Equal(got, want) {
		t.Fatal("sealed layer does not hold qemu-io's writes")
	}
}

// qemuIO is an interactive qemu-io session. qemu-io reads stdin through
// its main loop, so commands go one at a time: each is sent only after the
// prompt that follows the previous one has appeared.
type qemuIO struct {
	t     *testing.T
	stdin io.WriteCloser
	out   chan string // output chunks
	buf   string      // output not yet consumed
}

const qemuPrompt = "qemu-io> "

func startQemuIO(t *testing.T, imageOpts string) *qemuIO {
	t.Helper()
	cmd := exec.Command("qemu-io", "--image-opts", imageOpts)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	q := &qemuIO{t: t, stdin: stdin, out: make(chan string, 64)}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := out.Read(b)
			if n > 0 {
				q.out <- string(b[:n])
			}
			if err != nil {
				close(q.out)
				return
			}
		}
	}()
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	q.waitPrompt()
	return q
}

// waitPrompt returns the output up to the next prompt.
func (q *qemuIO) waitPrompt() string {
	q.t.Helper()
	for {
		if i := strings.Index(q.buf, qemuPrompt); i >= 0 {
			text := q.buf[:i]
			q.buf = q.buf[i+len(qemuPrompt):]
			return text
		}
		chunk, ok := <-q.out
		if !ok {
			q.t.Fatalf("qemu-io exited; output: %q", q.buf)
		}
		q.buf += chunk
	}
}

// do runs one command and checks its output contains want and no failure.
func (q *qemuIO) do(command, want string) {
	q.t.Helper()
	if _, err := io.WriteString(q.stdin, command+"\n"); err != nil {
		q.t.Fatal(err)
	}
	text := q.waitPrompt()
	l := strings.ToLower(text)
	if !strings.Contains(text, want) || strings.Contains(l, "fail") || strings.Contains(l, "error") {
		q.t.Fatalf("qemu-io %q: %q (want %q)", command, text, want)
	}
}

// TestQemuReconnectAcrossRestart: QEMU's NBD client (reconnect-delay set)
// stays attached while the daemon restarts: flushed data is there after the
// restart and new writes work, on the same socket and export name.
func TestQemuReconnectAcrossRestart(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-io")
	f := newFixture(t, 18)
	opts := testOptions(t)
	h := start(t, opts)
	dev, err := h.c.Create(ctxT(t), rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	q := startQemuIO(t, fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=%s,reconnect-delay=20", dev.Socket, dev.Export))
	q.do("write -P 0x61 65536 4096", "wrote 4096/4096")
	q.do("flush", "")
	h.stop()
	start(t, opts)
	q.do("read -P 0x61 65536 4096", "read 4096/4096")
	q.do("write -P 0x62 131072 4096", "wrote 4096/4096")
	q.do("read -P 0x62 131072 4096", "read 4096/4096")
}
