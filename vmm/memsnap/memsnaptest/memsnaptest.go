// Package memsnaptest runs helper processes for tests and benchmarks of
// memsnap: a helper maps a file (private or shared), reads and writes chosen
// pages, reports the mapping's address and then blocks until stopped, so a
// test can capture its memory the way it would capture a paused VMM's.
//
// The helper is the test binary itself: call Main at the start of TestMain.
package memsnaptest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const envHelper = "AENV_MEMSNAP_HELPER"

// PageSize is the host's base page size.
var PageSize = os.Getpagesize()

// Spec says what a helper does, in this order: map Size bytes of File (0: the
// file's size less Offset) from file offset Offset (page-aligned), MAP_SHARED
// when Shared else MAP_PRIVATE, as one mapping or, when Split > 0, as two
// (the first Split bytes and the rest, mapped in file order, so that mmap's
// top-down placement puts them in reverse address order, where they cannot
// merge into one VMA: a VMM with several memory regions has them apart); read
// every page in Reads; fill every page in Writes with Pattern(Seed, page);
// fill every page in Zeros with zeros. Pages are indexes into the mapping.
type Spec struct {
	File   string
	Offset int64
	Size   int64
	Split  int64
	Shared bool
	Seed   uint64
	Reads  []int64
	Writes []int64
	Zeros  []int64
}

// Pattern fills b (one page) with bytes derived from seed and page (never an
// all-zero page in practice).
func Pattern(b []byte, seed uint64, page int64) {
	x := seed ^ uint64(page)*0x9e3779b97f4a7c15
	for i := 0; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for k := range 8 {
			b[i+k] = byte(z >> (8 * k))
		}
	}
}

// Main runs the helper and exits when this process was started as one;
// otherwise it returns at once. Call it first in TestMain.
func Main() {
	if os.Getenv(envHelper) != "1" {
		return
	}
	if err := runHelper(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stdout, "error %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHelper(in io.Reader, out io.Writer) error {
	br := bufio.NewReader(in)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec Spec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("decode spec: %w", err)
	}
	regions, err := mapFile(spec)
	if err != nil {
		return err
	}
	ps := int64(PageSize)
	page := func(p int64) []byte {
		for _, m := range regions {
			if p*ps < int64(len(m)) {
				return m[p*ps : (p+1)*ps]
			}
			p -= int64(len(m)) / ps
		}
		panic(fmt.Sprintf("page %d outside the mapping", p))
	}
	sum := 0
	for _, p := range spec.Reads {
		for _, c := range page(p) {
			sum += int(c)
		}
	}
	for _, p := range spec.Writes {
		Pattern(page(p), spec.Seed, p)
	}
	for _, p := range spec.Zeros {
		clear(page(p))
	}
	addrs := make([]string, len(regions))
	for i, m := range regions {
		addrs[i] = fmt.Sprintf("%x:%x", uintptr(unsafeAddr(m)), len(m))
	}
	fmt.Fprintf(out, "ready %s %d\n", strings.Join(addrs, ","), sum)
	io.Copy(io.Discard, br) // block until the parent closes stdin
	runtime.KeepAlive(regions)
	return nil
}

// mapFile maps the file as spec says and returns the mappings in file order.
func mapFile(spec Spec) ([][]byte, error) {
	flag, mflag := os.O_RDONLY, unix.MAP_PRIVATE
	if spec.Shared {
		flag, mflag = os.O_RDWR, unix.MAP_SHARED
	}
	f, err := os.OpenFile(spec.File, flag, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mappings outlive the descriptor
	size := spec.Size
	if size == 0 {
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		size = fi.Size() - spec.Offset
	}
	type part struct{ off, n int64 }
	parts := []part{{spec.Offset, size}}
	if spec.Split > 0 && spec.Split < size {
		parts = []part{{spec.Offset, spec.Split}, {spec.Offset + spec.Split, size - spec.Split}}
	}
	out := make([][]byte, len(parts))
	for i := range parts {
		mem, err := unix.Mmap(int(f.Fd()), parts[i].off, int(parts[i].n), unix.PROT_READ|unix.PROT_WRITE, mflag)
		if err != nil {
			return nil, fmt.Errorf("mmap %s: %w", spec.File, err)
		}
		out[i] = mem
	}
	return out, nil
}

// Proc is a running helper.
type Proc struct {
	Pid  int
	Addr uint64 // start of the (first, in file order) mapping
	Size int64
	// Regions are the mappings in file order: address and length.
	Regions [][2]uint64
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan error
}

// Start runs a helper for spec and waits until it has done its reads and
// writes. Stop it with Stop.
func Start(ctx context.Context, spec Spec) (*Proc, error) {
	if spec.Size == 0 {
		fi, err := os.Stat(spec.File)
		if err != nil {
			return nil, err
		}
		spec.Size = fi.Size() - spec.Offset
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start memory helper: %w", err)
	}
	p := &Proc{Pid: cmd.Process.Pid, Size: spec.Size, cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, stdout)
		p.done <- cmd.Wait()
	}()
	if err := json.NewEncoder(stdin).Encode(spec); err != nil {
		p.Stop()
		return nil, fmt.Errorf("send spec to memory helper: %w", err)
	}
	select {
	case line := <-ready:
		if err := p.parseReady(line); err != nil {
			p.Stop()
			return nil, err
		}
		return p, nil
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

// parseReady reads "ready ADDR:LEN[,ADDR:LEN] SUM".
func (p *Proc) parseReady(line string) error {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "ready" {
		return fmt.Errorf("memory helper: %q", strings.TrimSpace(line))
	}
	for _, r := range strings.Split(f[1], ",") {
		var addr, n uint64
		if _, err := fmt.Sscanf(r, "%x:%x", &addr, &n); err != nil {
			return fmt.Errorf("memory helper: region %q: %w", r, err)
		}
		p.Regions = append(p.Regions, [2]uint64{addr, n})
	}
	p.Addr = p.Regions[0][0]
	return nil
}

// Memory reads the helper's whole mapping (its regions in file order)
// through /proc/<pid>/mem.
func (p *Proc) Memory() ([]byte, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", p.Pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []byte
	for _, r := range p.Regions {
		b := make([]byte, r[1])
		if _, err := f.ReadAt(b, int64(r[0])); err != nil {
			return nil, fmt.Errorf("read memory of pid %d at %#x: %w", p.Pid, r[0], err)
		}
		out = append(out, b...)
	}
	return out, nil
}

// Stop ends the helper (closing its stdin, then killing it if it lingers) and
// reaps it. Calling Stop twice is fine.
func (p *Proc) Stop() error {
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	if p.done == nil {
		return nil
	}
	var err error
	select {
	case err = <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		err = <-p.done
	}
	p.done = nil
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("memory helper %d: %w", p.Pid, err)
	}
	return err
}
