package lsmt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
)

const fuzzSectors = 64

// fuzzUpper is the state of one FuzzUpperOps run.
type fuzzUpper struct {
	t      *testing.T
	dp, ip string
	u      *Upper
	st     *Stack
	m      *histModel
}

func (f *fuzzUpper) open() {
	u, err := OpenUpper(f.dp, f.ip, false)
	if err != nil {
		f.t.Fatalf("reopen: %v", err)
	}
	u.rewriteMin = 8 // rewrite the index often
	u.slack = 8      // and reclaim freed space often
	st, err := NewStack(nil, u)
	if err != nil {
		f.t.Fatal(err)
	}
	f.u, f.st = u, st
}

// crash drops the upper as a killed process would (nothing flushed; what
// it wrote stays in the page cache, its pending journal with it) and opens
// it again: every sector reads the version it had, flushed or not.
func (f *fuzzUpper) crash() {
	f.u.closeFiles()
	f.open()
	if err := f.m.check(f.st, false); err != nil {
		f.t.Fatalf("after a crash: %v", err)
	}
	f.m.flushed()
}

// flushFailing flushes with an index rewrite failing before (synced) or
// after (renamed) its rename; with no rewrite due, the flush succeeds.
func (f *fuzzUpper) flushFailing(after bool) {
	point := "lsmt/index-rewrite/synced"
	if after {
		point = "lsmt/index-rewrite/renamed"
	}
	if err := failpoint.Arm(point, "error"); err != nil {
		f.t.Fatal(err)
	}
	err := f.u.Flush()
	failpoint.Arm(point, "")
	if err == nil {
		f.m.flushed()
	}
}

func (f *fuzzUpper) step(op, a, b byte) {
	s := uint64(a) % fuzzSectors
	n := 1 + uint64(b)%min(24, fuzzSectors-s)
	var err error
	switch op % 8 {
	case 0, 1, 2:
		err = f.m.write(f.st, s, n)
	case 3, 4:
		err = f.m.trim(f.st, s, n)
	case 5:
		if err = f.u.Flush(); err == nil {
			f.m.flushed()
		}
	case 6:
		if op&0x80 != 0 {
			f.flushFailing(op&0x40 != 0)
			return
		}
		if err = f.u.Close(); err == nil {
			f.m.flushed()
			f.open()
		}
	case 7:
		f.crash()
	}
	if err != nil {
		f.t.Fatalf("op %d [%d,+%d): %v", op%8, s, n, err)
	}
}

// FuzzUpperOps drives a log-structured upper through writes, trims,
// flushes (some with the index rewrite failing), reopenings and crashes
// of the process, checking every read against a model, the space sets
// after every step, and the data file's size.
func FuzzUpperOps(f *testing.F) {
	f.Add([]byte{0, 0, 30, 3, 4, 10, 5, 0, 0, 1, 8, 8, 7, 0, 0})
	f.Add([]byte{0, 0, 63, 3, 0, 63, 5, 0, 0, 0, 10, 3, 0, 40, 20, 7, 0, 0, 4, 1, 1, 5, 0, 0})
	f.Add([]byte{0, 5, 9, 0, 6, 2, 3, 5, 3, 5, 0, 0, 0, 9, 9, 6, 0, 0, 0x86, 0, 0, 0xc6, 0, 0, 7, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 600 {
			return
		}
		dir, err := os.MkdirTemp(tmpBase(), "lsmt-fuzz-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		fu := &fuzzUpper{t: t, dp: filepath.Join(dir, "d"), ip: filepath.Join(dir, "i"), m: newHistModel(fuzzSectors)}
		u, err := CreateUpper(fu.dp, fu.ip, fuzzSectors*SectorSize, UUID{})
		if err != nil {
			t.Fatal(err)
		}
		u.Close()
		fu.open()
		defer func() { fu.u.Close() }()
		for ; len(ops) >= 3; ops = ops[3:] {
			fu.step(ops[0], ops[1], ops[2])
			if err := fu.m.check(fu.st, false); err != nil {
				t.Fatal(err)
			}
			if err := fu.u.checkSpace(); err != nil {
				t.Fatal(err)
			}
			fu.u.mu.RLock()
			end, limit := fu.u.dataEnd, fu.u.softLimit()
			fu.u.mu.RUnlock()
			if end > limit {
				t.Fatalf("the data file's end %d passed the soft limit %d", end, limit)
			}
		}
	})
}
