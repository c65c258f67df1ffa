package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCIFailsWhenSetupIsMissing takes away, one at a time, something the
// machine setup installs (versitygw, redis-server, the kernel lane's kernel)
// and runs a real test that needs it: under CI=true it must fail and name
// what is missing; without CI it skips. This is what keeps a broken setup
// step from turning a suite green.
func TestCIFailsWhenSetupIsMissing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: compiles three packages' tests (CI runs without -short)")
	}
	goBin := RequireTool(t, "go", "the Go toolchain runs the tests")
	cases := []struct {
		name, pkg, test, hide, want string
		env                         func(dir string) []string
	}{
		{name: "versitygw", pkg: "./snapshot/repo/s3/", test: "TestLargeBlob", hide: "versitygw", want: "versitygw is not installed",
			env: func(dir string) []string { return []string{"GOPATH=" + filepath.Join(dir, "gopath")} }},
		{name: "redis-server", pkg: "./cluster/scheduler/", test: "TestRestorePlacementTCG", hide: "redis-server", want: "redis-server is not installed"},
		{name: "lane kernel", pkg: "./storage/ublk/", test: "TestKernelLane", hide: "apt-get", want: "kernel package unavailable",
			env: func(dir string) []string {
				return []string{"AENV_KERNELLANE_CACHE=" + filepath.Join(dir, "kernel-cache")}
			}},
	}
	root := moduleRoot(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "pkg.test")
			build := exec.Command(goBin, "test", "-c", "-o", bin, c.pkg)
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go test -c %s: %v\n%s", c.pkg, err, out)
			}
			env := []string{"PATH=" + pathWithout(t, dir, c.hide), "HOME=" + dir, "TMPDIR=" + os.TempDir()}
			if c.env != nil {
				env = append(env, c.env(dir)...)
			}
			for _, ci := range []string{"true", ""} {
				cmd := exec.Command(bin, "-test.run", "^"+c.test+"$", "-test.v", "-test.count=1")
				cmd.Dir = filepath.Join(root, c.pkg)
				cmd.Env = append(env, "CI="+ci)
				out, err := cmd.CombinedOutput()
				checkOutcome(t, c.test, ci, string(out), err, c.want)
			}
		})
	}
}

// checkOutcome asserts that a run without the tool failed under CI=true
// and skipped otherwise, naming the missing piece both times.
func checkOutcome(t *testing.T, test, ci, out string, err error, want string) {
	t.Helper()
	if !strings.Contains(out, want) {
		t.Errorf("CI=%q: %s output does not name what is missing (%q):\n%s", ci, test, want, out)
	}
	if ci != "" {
		if err == nil || !strings.Contains(out, "--- FAIL: "+test) || !strings.Contains(out, "CI=true and the setup should have installed this") {
			t.Errorf("CI=true: %s did not fail for the missing tool (err %v):\n%s", test, err, out)
		}
		return
	}
	if err != nil || !strings.Contains(out, "--- SKIP: "+test) {
		t.Errorf("without CI: %s did not skip (err %v):\n%s", test, err, out)
	}
}

// pathWithout returns a PATH of one directory under dir holding links to
// every program of the usual PATH directories except hide.
func pathWithout(t *testing.T, dir, hide string) string {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.Name() == hide || e.IsDir() {
				continue
			}
			// The first directory on PATH wins, as it would for a lookup.
			_ = os.Symlink(filepath.Join(d, e.Name()), filepath.Join(bin, e.Name()))
		}
	}
	if _, err := exec.LookPath(filepath.Join(bin, hide)); err == nil {
		t.Fatalf("%s still reachable in %s", hide, bin)
	}
	return bin
}

// moduleRoot is the directory of go.mod above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
