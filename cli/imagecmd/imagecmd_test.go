package imagecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/storage/image"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("aenv image %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestWorkflow runs every subcommand the way an operator would and checks
// the exported disk against what was written.
func TestWorkflow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	const size = 8 << 20
	raw := make([]byte, size)
	copy(raw[0:], randBytes(1, 1<<20))
	copy(raw[5<<20:], bytes.Repeat([]byte("agentenv"), 1<<16))
	if err := os.WriteFile(p("disk.raw"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "import", "-m", "base", p("disk.raw"), p("base.lsmt"))
	mustRun(t, "create", "--lower", "base.lsmt", p("img.json"))

	im, err := image.Open(context.Background(), p("img.json"), image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	patch := randBytes(2, 64<<10)
	if _, err := im.WriteAt(patch, 3<<20+512); err != nil {
		t.Fatal(err)
	}
	copy(raw[3<<20+512:], patch)
	if err := im.Trim(0, 4096); err != nil {
		t.Fatal(err)
	}
	clear(raw[:4096])
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, "commit", "-m", "patch", p("img.json"), p("top.lsmt"))
	if !strings.Contains(out, "committed") {
		t.Fatalf("commit output %q", out)
	}
	mustRun(t, "merge", "-m", "flat", p("flat.lsmt"), p("base.lsmt"), p("top.lsmt"))
	mustRun(t, "compress", "--block-size", "16384", p("flat.lsmt"), p("flat.zfile"))
	mustRun(t, "compress", "--algo", "lz4", p("top.lsmt"), p("top.lz4.zfile"))

	for _, src := range [][]string{{p("img.json")}, {p("base.lsmt"), p("top.lsmt")}, {p("flat.zfile")}, {p("base.lsmt"), p("top.lz4.zfile")}} {
		mustRun(t, append([]string{"export", "--out", p("out.raw")}, src...)...)
		got, err := os.ReadFile(p("out.raw"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, raw) {
			t.Fatalf("export of %v differs from the written content", src)
		}
	}

	var rep LayerReport
	if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", p("flat.zfile"))), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.ZFile == nil || rep.ZFile.BlockSize != 16384 || rep.Kind != "sealed" || rep.Message != "flat" || rep.VirtualSize != size {
		t.Fatalf("info of the ZFile: %+v", rep)
	}
	txt := mustRun(t, "info", "--segments", p("top.lsmt"))
	if !strings.Contains(txt, "zeroed") || !strings.Contains(txt, "patch") {
		t.Fatalf("info of top.lsmt lacks the zeroed mapping or message:\n%s", txt)
	}
	mustRun(t, "info", p("img.json"))
	for _, f := range []string{p("img.json"), p("flat.zfile"), p("top.lz4.zfile"), p("base.lsmt")} {
		if out := mustRun(t, "check", f); !strings.Contains(out, "ok") {
			t.Fatalf("check %s: %q", f, out)
		}
	}

	// A flipped byte inside a compressed block must fail check, naming the file.
	z, _ := os.ReadFile(p("flat.zfile"))
	z[600] ^= 0xff
	if err := os.WriteFile(p("bad.zfile"), z, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "check", p("bad.zfile")); err == nil || !strings.Contains(err.Error(), "bad.zfile") || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("check of a corrupted ZFile: %v", err)
	}
}

func TestImportDirectory(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("mke2fs"); err != nil {
		testenv.Missing(t, "mke2fs (e2fsprogs) is not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := []byte("hello from a layer\n")
	if err := os.WriteFile(filepath.Join(src, "etc", "motd"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "import", "--size", "16M", src, filepath.Join(dir, "fs.lsmt"))
	mustRun(t, "export", "--out", filepath.Join(dir, "fs.img"), filepath.Join(dir, "fs.lsmt"))
	if _, err := exec.LookPath("debugfs"); err != nil {
		testenv.Missing(t, "debugfs (e2fsprogs) is not installed")
	}
	out, err := exec.Command("debugfs", "-R", "cat /etc/motd", filepath.Join(dir, "fs.img")).Output()
	if err != nil {
		t.Fatalf("debugfs: %v", err)
	}
	if !bytes.Equal(out, want) {
		t.Fatalf("file read back from the exported ext4: %q", out)
	}
}

func TestErrorsNameFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.bin")
	if err := os.WriteFile(junk, randBytes(3, 20000), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"info", junk}, {"check", junk}, {"export", "--out", filepath.Join(dir, "o"), junk}} {
		_, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), junk) {
			t.Fatalf("%v: error %v does not name %s", args, err, junk)
		}
	}
	if _, err := run(t, "create", filepath.Join(dir, "x.json")); err == nil {
		t.Fatal("create without --size or --lower succeeded")
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"4096": 4096, "64M": 64 << 20, "10G": 10 << 30, "1GiB": 1 << 30, "512k": 512 << 10} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1Q", "99999999999T"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}
