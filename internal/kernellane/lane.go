// Package kernellane runs a package's tests inside a small VM booting
// Debian's 6.12 cloud kernel, for tests of kernel drivers the host lacks
// (ublk_drv, nbd, loop): the "kernel lane".
//
// A host-side test calls RunTests. The lane takes the package's test binary
// (the running one when it is static, else one rebuilt with `go test -c`
// and CGO_ENABLED=0), packs it with a small Go init (laneinit), the wanted
// kernel modules with their dependencies and, on request, fio with its
// shared libraries into a newc initramfs, boots it under QEMU (TCG unless
// told otherwise) with the serial console on a pipe, streams the console to
// the test log and returns the output and the exit code the init reports.
// The kernel package is downloaded once with apt-get and extracted with
// dpkg-deb (never installed) under the cache directory, named by the hash of
// the package file; initramfs images are cached by the hash of their
// contents. Inside the guest, InGuest reports true and the selected tests
// run as root against the guest's kernel.
//
// Callers run their tests under `flock /tmp/aenv-vm.lock` like every other
// VM-booting test: the lane does not take that lock itself, so that a run
// under flock(1) does not deadlock on it.
package kernellane

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernelpkg"
	"github.com/agentenv/agentenv/internal/testenv"
)

// envGuest is set in the guest's environment for the test binary.
const envGuest = "AENV_KERNEL_LANE"

// exitMarker precedes the exit code on the console (laneinit prints it).
const exitMarker = "AENV-LANE-EXIT"

// InGuest reports whether this process runs inside a lane guest.
func InGuest() bool { return os.Getenv(envGuest) == "1" }

// DefaultCacheDir is $AENV_KERNELLANE_CACHE or /var/cache/aenv/kernellane.
func DefaultCacheDir() string {
	if d := os.Getenv("AENV_KERNELLANE_CACHE"); d != "" {
		return d
	}
	return "/var/cache/aenv/kernellane"
}

// Options say what a lane run boots and runs.
type Options struct {
	// Run is the -test.run pattern for the guest (required).
	Run string
	// Args are more test flags (e.g. -test.bench).
	Args []string
	// Env is added to the guest test binary's environment.
	Env []string
	// Modules to load, dependencies resolved; default ublk_drv, nbd, loop.
	Modules []string
	// Fio adds /usr/bin/fio and its libraries.
	Fio bool
	// Programs are more dynamically linked programs to add with the
	// libraries ldd lists for them, at their host paths.
	Programs []string
	// Files are more host files to add: guest path -> host path.
	Files map[string]string
	// Binary is the test binary; default: this package's (see package doc).
	Binary string
	// MemoryMiB and CPUs of the guest; defaults 1024 and 2.
	MemoryMiB, CPUs int
	// Timeout of the whole run; default 5 minutes.
	Timeout time.Duration
	// CacheDir; default DefaultCacheDir().
	CacheDir string
	// Log receives the console line by line; default none.
	Log func(line string)
}

// Result is what a lane run printed and how its test binary exited.
type Result struct {
	Output   string
	ExitCode int
	Boot     time.Duration // from QEMU start to the test binary's first line
	Total    time.Duration
}

// Ran reports whether the test binary's verbose output says test passed.
func (r *Result) Ran(test string) bool {
	return regexp.MustCompile(`(?m)^\s*--- PASS: ` + regexp.QuoteMeta(test) + ` \(`).MatchString(r.Output)
}

// Unavailable returns why the lane cannot run here (no QEMU), or nil. A
// missing kernel package shows up from Run as ErrNoKernel.
func Unavailable() error {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return fmt.Errorf("kernel lane: qemu-system-x86_64 not found (apt-get install qemu-system-x86): %w", err)
	}
	return nil
}

// RunTests boots the lane with the test binary of the calling package and
// fails t unless it exits 0 and every test in expect passed (not skipped).
// It skips t when QEMU or the kernel package is missing (fails under CI=true:
// internal/testenv).
func RunTests(t testing.TB, o Options, expect ...string) *Result {
	t.Helper()
	if InGuest() {
		t.Skip("kernel lane: already inside the lane")
	}
	if raceEnabled {
		// The guest binary is rebuilt without the race detector anyway;
		// the plain test pass boots the lane.
		t.Skip("kernel lane: not under the race detector (the plain test pass runs it)")
	}
	if err := Unavailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	if o.Log == nil {
		o.Log = func(l string) { t.Log(l) }
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		if isNoKernel(err) {
			testenv.Missing(t, "%v", err)
		}
		t.Fatal(err)
	}
	t.Logf("kernel lane: boot %v, total %v, exit %d", res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond), res.ExitCode)
	if res.ExitCode != 0 {
		t.Fatalf("kernel lane: test binary exited %d", res.ExitCode)
	}
	for _, name := range expect {
		if !res.Ran(name) {
			t.Errorf("kernel lane: %s did not pass in the guest (skipped or missing)", name)
		}
	}
	return res
}

// Initramfs builds (or reuses) the initramfs o describes without booting
// it, and returns its path and the kernel it is made for: for a test that
// boots a guest of its own inside the lane (a VMM under test), with laneinit
// as that guest's init and o.Binary as its program.
func Initramfs(ctx context.Context, o Options) (string, *kernelpkg.Kernel, error) {
	if err := o.defaults(); err != nil {
		return "", nil, err
	}
	k, err := kernelpkg.Fetch(ctx, o.CacheDir, KernelPackage, nil)
	if err != nil {
		return "", nil, err
	}
	initrd, err := buildInitramfs(ctx, o, k)
	return initrd, k, err
}

// Run builds (or reuses) the initramfs and boots it once.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	k, err := kernelpkg.Fetch(ctx, o.CacheDir, KernelPackage, nil)
	if err != nil {
		return nil, err
	}
	initrd, err := buildInitramfs(ctx, o, k)
	if err != nil {
		return nil, err
	}
	return boot(ctx, o, k, initrd)
}

func (o *Options) defaults() error {
	if o.Run == "" {
		return fmt.Errorf("kernel lane: no -test.run pattern")
	}
	if o.Modules == nil {
		o.Modules = []string{"ublk_drv", "nbd", "loop"}
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 1024
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.Log == nil {
		o.Log = func(string) {}
	}
	return os.MkdirAll(o.CacheDir, 0o755)
}

// boot runs QEMU until the guest resets, the context ends or QEMU dies.
func boot(ctx context.Context, o Options, k *kernelpkg.Kernel, initrd string) (*Result, error) {
	// q35, not microvm: this kernel stalls early on microvm under TCG.
	// Single-threaded TCG: with one host thread per vCPU, a vCPU could run
	// code another was patching with int3 breakpoints (the kernel's text
	// poking at boot), and the guest died of an unexpected int3 in
	// sched_clock_cpu (seen once in CI); one thread runs the vCPUs in turn.
	args := []string{
		"-M", "q35", "-accel", "tcg,thread=single", "-cpu", "max",
		"-m", strconv.Itoa(o.MemoryMiB), "-smp", strconv.Itoa(o.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", k.Vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4 rdinit=/init mitigations=off tsc=reliable",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kernel lane: start qemu: %w", err)
	}
	res := &Result{ExitCode: -1}
	var buf strings.Builder
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			if res.Boot == 0 && strings.HasPrefix(line, "=== RUN") {
				res.Boot = time.Since(start)
			}
			if v, ok := strings.CutPrefix(line, exitMarker+" "); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					res.ExitCode = n
				}
			}
			buf.WriteString(line + "\n")
			o.Log(line)
		}
	}()
	wg.Wait() // the pipe closes when QEMU exits
	werr := cmd.Wait()
	res.Total, res.Output = time.Since(start), buf.String()
	if ctx.Err() != nil {
		return res, fmt.Errorf("kernel lane: %w after %v; console tail:\n%s", ctx.Err(), res.Total, tail(res.Output, 40))
	}
	if res.ExitCode < 0 {
		return res, fmt.Errorf("kernel lane: the guest ended without an exit marker (qemu: %v); console tail:\n%s", werr, tail(res.Output, 40))
	}
	return res, nil
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// testBinary returns a static test binary of the calling package: the
// running one when it is static, else one built by `go test -c` in the
// working directory (a test's working directory is its package's).
func testBinary(ctx context.Context, dir string) (string, error) {
	self, err := os.Executable()
	if err == nil && isStatic(self) {
		return self, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out := filepath.Join(dir, "pkg.test")
	cmd := exec.CommandContext(ctx, goBin, "test", "-c", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kernel lane: go test -c: %w: %s", err, b)
	}
	return out, nil
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}
