package lsmt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
)

// TestReuseAfterTrim: the space a trim freed is written again only after a
// flush made the trim durable: a write right after the trim goes elsewhere,
// one after the flush lands in the trimmed space, and neither the data
// file nor its blocks grow.
func TestReuseAfterTrim(t *testing.T) {
	const vs = 1 << 20
	u, st, dp := newBoundUpper(t, vs)
	m := newHistModel(vs / SectorSize)
	if err := m.write(st, 0, 256); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	old := u.Lookup(nil, 0, 1)[0].MOffset
	blocks := allocated(t, dp)
	if err := m.trim(st, 0, 256); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, dp); a > blocks-100*SectorSize {
		t.Fatalf("a trim of 128 KiB gave %d bytes back to the host, want most of it", blocks-a)
	}
	if err := m.write(st, 512, 8); err != nil {
		t.Fatal(err)
	}
	if got := u.Lookup(nil, 512, 1)[0].MOffset; got >= old && got < old+256 {
		t.Fatalf("a write before the trim was durable reused its space (sector %d)", got)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.write(st, 1024, 64); err != nil {
		t.Fatal(err)
	}
	if got := u.Lookup(nil, 1024, 1)[0].MOffset; got < old || got >= old+256 {
		t.Fatalf("a write after the trim was durable went to sector %d, not into the trimmed [%d,+256)", got, old)
	}
	if err := m.check(st, false); err != nil {
		t.Fatal(err)
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
	if err := m.check(stackOf(t, u), false); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentReuse: writers, trimmers, readers and flushes in parallel
// (run it with -race), with freed space reclaimed and the index rewritten
// often. Owners each hold a range of their own and check every read of it
// exactly; racers write, trim and read one shared range at once. A freed
// range handed to a new write while an in-place write or a read of it was
// in flight would show as another range's data.
func TestConcurrentReuse(t *testing.T) {
	const (
		vs      = 1 << 20
		owners  = 3
		span    = 256 // sectors per range
		rounds  = 1500
		shared  = owners * span
		sectors = vs / SectorSize
	)
	dir := t.TempDir()
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.slack, u.rewriteMin = 16, 32
	st, _ := NewStack(nil, u)
	var wg sync.WaitGroup
	errs := make(chan error, owners+3)
	for o := range owners {
		wg.Go(func() { errs <- ownRange(st, uint64(o*span), span, rounds, uint64(o)) })
	}
	for r := range 2 {
		wg.Go(func() { errs <- raceRange(st, shared, span, rounds, uint64(10+r)) })
	}
	stop := make(chan struct{})
	var fl sync.WaitGroup
	fl.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := st.Flush(); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	fl.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, filepath.Join(dir, "d")); a > sectors*SectorSize+HeaderSize+int64(u.slack)*SectorSize+64<<10 {
		t.Fatalf("the data file holds %d bytes of the host's disk", a)
	}
}

// ownRange writes, trims and reads [start, start+n) alone: reads return
// exactly what it wrote last.
func ownRange(st *Stack, start, n uint64, rounds int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 1))
	cur := make([]uint64, n)
	b := make([]byte, 32*SectorSize)
	for i := range rounds {
		s := r.Uint64N(n)
		l := 1 + r.Uint64N(min(n-s, 32))
		switch r.IntN(3) {
		case 0:
			for k := range l {
				cur[s+k] = uint64(i+1)<<8 | seed
				tagSector(b[k*SectorSize:], start+s+k, cur[s+k])
			}
			if _, err := st.WriteAt(b[:l*SectorSize], int64(start+s)*SectorSize); err != nil {
				return err
			}
		case 1:
			if err := st.Trim(int64(start+s)*SectorSize, int64(l)*SectorSize); err != nil {
				return err
			}
			clear(cur[s : s+l])
		default:
			if _, err := st.ReadAt(b[:l*SectorSize], int64(start+s)*SectorSize); err != nil {
				return err
			}
			var want [SectorSize]byte
			for k := range l {
				tagSector(want[:], start+s+k, cur[s+k])
				if !bytes.Equal(b[k*SectorSize:(k+1)*SectorSize], want[:]) {
					sec, ver, _ := sectorTag(b[k*SectorSize : (k+1)*SectorSize])
					return fmt.Errorf("sector %d reads sector %d version %d, want version %d", start+s+k, sec, ver, cur[s+k])
				}
			}
		}
	}
	return nil
}

// raceRange writes, trims and reads [start, start+n) with others: a read
// returns each sector's own data (some versions of it), or zeros.
func raceRange(st *Stack, start, n uint64, rounds int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, 32*SectorSize)
	for i := range rounds {
		s := start + r.Uint64N(n)
		l := 1 + r.Uint64N(min(start+n-s, 32))
		switch r.IntN(3) {
		case 0:
			for k := range l {
				tagSector(b[k*SectorSize:], s+k, uint64(i+1)<<8|seed)
			}
			if _, err := st.WriteAt(b[:l*SectorSize], int64(s)*SectorSize); err != nil {
				return err
			}
		case 1:
			if err := st.Trim(int64(s)*SectorSize, int64(l)*SectorSize); err != nil {
				return err
			}
		default:
			if _, err := st.ReadAt(b[:l*SectorSize], int64(s)*SectorSize); err != nil {
				return err
			}
			// A read racing a write or a trim of the same sector may see
			// a mix of its versions, but each carries the sector's number.
			for k := range l {
				if tag := binary.LittleEndian.Uint64(b[k*SectorSize:]); tag != 0 && tag != s+k+1 {
					return fmt.Errorf("shared sector %d reads sector %d's data", s+k, tag-1)
				}
			}
		}
	}
	return nil
}

// TestPinnedSpaceIsNotReused: an operation that looked up data of the
// upper (an in-place write, a read, a trim about to punch) and is slow to
// do its I/O keeps that space from being handed to a new write, even once
// a trim freed it and a flush made the trim durable. Without the pin the
// new write's data would be overwritten by the late write, read as the
// trimmed range's data, or punched away.
func TestPinnedSpaceIsNotReused(t *testing.T) {
	for _, c := range []struct{ name, point string }{
		{"write", "lsmt/write/planned"},
		{"read", "lsmt/read/looked-up"},
		{"trim", "lsmt/trim/freed"},
	} {
		t.Run(c.name, func(t *testing.T) { pinnedSpace(t, c.name, c.point) })
	}
}

func pinnedSpace(t *testing.T, op, point string) {
	const vs = 1 << 20
	u, st, _ := newBoundUpper(t, vs)
	m := newHistModel(vs / SectorSize)
	if err := m.write(st, 0, 8); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	old := u.Lookup(nil, 0, 1)[0].MOffset
	if err := failpoint.Arm(point, "delay:300ms@1"); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Arm(point, "")
	slow := make(chan error, 1)
	late := make([]byte, 8*SectorSize)
	go func() {
		var err error
		switch op {
		case "write":
			for k := range 8 {
				tagSector(late[k*SectorSize:], uint64(k), 1<<40)
			}
			_, err = st.WriteAt(late, 0)
		case "read":
			_, err = st.ReadAt(late, 0)
		case "trim":
			err = st.Trim(0, 8*SectorSize)
		}
		slow <- err
	}()
	// Until the slow operation holds its pin (or, were it not to take one,
	// surely sits at its fault point).
	for start := time.Now(); u.pins[0].Load()+u.pins[1].Load() == 0 && time.Since(start) < 100*time.Millisecond; {
		time.Sleep(time.Millisecond)
	}
	if op != "trim" {
		if err := m.trim(st, 0, 8); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.write(st, 100, 8); err != nil {
		t.Fatal(err)
	}
	if got := u.Lookup(nil, 100, 1)[0].MOffset; got >= old && got < old+8 {
		t.Fatalf("a write got the trimmed space (sector %d) while a slow %s still used it", got, op)
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if op == "read" {
		for k := range 8 {
			if tag, _, _ := sectorTag(late[k*SectorSize : (k+1)*SectorSize]); !isZero(late[k*SectorSize:(k+1)*SectorSize]) && tag != uint64(k) {
				t.Fatalf("the slow read of sector %d returned sector %d's data", k, tag)
			}
		}
	}
	// The slow operation is done: the space is reused now.
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.write(st, 200, 8); err != nil {
		t.Fatal(err)
	}
	if got := u.Lookup(nil, 200, 1)[0].MOffset; got != old {
		t.Fatalf("once the slow %s was done, a write went to sector %d, not into the freed %d", op, got, old)
	}
	if op != "read" {
		// The trim is done; the late write landed in the freed space.
		for k := range uint64(8) {
			m.set(k, 0)
		}
	}
	if err := m.check(st, false); err != nil {
		t.Fatal(err)
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
	if err := m.check(stackOf(t, u), false); err != nil {
		t.Fatal(err)
	}
}

// TestOpenReclaimsGarbage: data whose mappings never reached the index (a
// power loss before its flush: the pending journal is of another boot) is
// garbage in the data file; opening the upper punches it out and later
// writes reuse its space.
func TestOpenReclaimsGarbage(t *testing.T) {
	const vs = 1 << 20
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "d"), filepath.Join(dir, "i")
	u, err := CreateUpper(dp, ip, vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	m := newHistModel(vs / SectorSize)
	if err := m.write(u, 0, 8); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	m.flushed()
	if err := m.write(u, 1024, 1024); err != nil { // 512 KiB, never mapped on disk
		t.Fatal(err)
	}
	u.data.Sync()
	u.closeFiles() // killed
	if a := allocated(t, dp); a < 512<<10 {
		t.Fatalf("the test's garbage holds %d bytes, want 512 KiB", a)
	}
	boot := bootID
	bootID = func() string { return "the next boot" }
	defer func() { bootID = boot }()
	u, err = OpenUpper(dp, ip, false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if a := allocated(t, dp); a > 64<<10 {
		t.Fatalf("after reopening, the data file still holds %d bytes", a)
	}
	for s := uint64(1024); s < 2048; s++ {
		m.set(s, 0) // lost with their mappings
	}
	end := u.dataEnd
	if err := m.write(u, 100, 1000); err != nil {
		t.Fatal(err)
	}
	if u.dataEnd != end {
		t.Fatalf("a write after reopening grew the data file (%d -> %d sectors) instead of reusing the garbage", end, u.dataEnd)
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
	if err := m.check(stackOf(t, u), false); err != nil {
		t.Fatal(err)
	}
}
