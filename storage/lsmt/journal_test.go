package lsmt

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// died closes the upper's files as the death of its process does: nothing
// flushed, the page cache keeps what was written.
func died(u *Upper) { u.closeFiles() }

func readUpper(t *testing.T, u *Upper) []byte {
	t.Helper()
	b := make([]byte, u.VirtualSize())
	if _, err := stackOf(t, u).ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUpperSurvivesProcessDeath: writes answered but not flushed when the
// process serving the upper dies are there when the next process opens it
// (a ublk server or the storage daemon replaced under a guest whose next
// flush the new process answers): new mappings, trims, in-place writes,
// and those made while a flush ran.
func TestUpperSurvivesProcessDeath(t *testing.T) {
	const vs = 1 << 20
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "up.data"), filepath.Join(dir, "up.index")
	u, err := CreateUpper(dp, ip, vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, vs)
	write := func(off int, c byte, n int) {
		t.Helper()
		b := bytes.Repeat([]byte{c}, n)
		if _, err := u.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], b)
	}
	write(0, 1, 256<<10) // flushed below
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	write(512<<10, 2, 64<<10) // a new mapping, after a flush
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	write(768<<10, 3, 64<<10) // new mappings, never flushed
	write(900<<10, 4, 8<<10)
	write(4096, 5, 4096) // in place over flushed data
	if err := u.Trim(128<<10, 64<<10); err != nil {
		t.Fatal(err)
	}
	clear(model[128<<10 : 192<<10])
	died(u)

	if u, err = OpenUpper(dp, ip, false); err != nil {
		t.Fatal(err)
	}
	if got := readUpper(t, u); !bytes.Equal(got, model) {
		t.Fatalf("after the process died the upper reads %s, want what was written", diffAt(got, model))
	}
	// The replayed mappings are in the index now: a second death loses
	// nothing either, and a clean close leaves no journal.
	write(300<<10, 6, 4096)
	died(u)
	if u, err = OpenUpper(dp, ip, false); err != nil {
		t.Fatal(err)
	}
	if got := readUpper(t, u); !bytes.Equal(got, model) {
		t.Fatalf("after a second death the upper reads %s, want what was written", diffAt(got, model))
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ip + ".pending"); !os.IsNotExist(err) {
		t.Fatalf("journal after a clean close: %v", err)
	}
}

// diffAt names the first byte where got differs from want.
func diffAt(got, want []byte) string {
	i := firstDiff(got, want)
	if i == len(got) {
		return "the same bytes"
	}
	return fmt.Sprintf("byte %d = %#x, want %#x", i, got[i], want[i])
}

// TestUpperJournalOfAnotherBoot: after a power loss (another boot) the
// journal is ignored; the upper reads what its index says, which is what
// the last flush made durable.
func TestUpperJournalOfAnotherBoot(t *testing.T) {
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "up.data"), filepath.Join(dir, "up.index")
	u, err := CreateUpper(dp, ip, 64<<10, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.WriteAt(bytes.Repeat([]byte{7}, 8192), 0); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := u.WriteAt(bytes.Repeat([]byte{8}, 4096), 32<<10); err != nil {
		t.Fatal(err)
	}
	died(u)
	boot := bootID
	bootID = func() string { return "another-boot" }
	defer func() { bootID = boot }()
	if u, err = OpenUpper(dp, ip, false); err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	want := make([]byte, 64<<10)
	copy(want, bytes.Repeat([]byte{7}, 8192))
	if got := readUpper(t, u); !bytes.Equal(got, want) {
		t.Fatalf("after another boot the upper reads %s, want what the flush made durable", diffAt(got, want))
	}
}

// TestUpperJournalUnderFlushes: writers race a flusher (which rotates the
// journal while writes go on); when the process dies, every answered write
// is there after the reopen.
func TestUpperJournalUnderFlushes(t *testing.T) {
	const writers, region = 4, 256 << 10
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "up.data"), filepath.Join(dir, "up.index")
	u, err := CreateUpper(dp, ip, writers*region, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, writers*region)
	stop := make(chan struct{})
	flushed := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				flushed <- nil
				return
			default:
			}
			if err := u.Flush(); err != nil {
				flushed <- err
				return
			}
		}
	}()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			buf := make([]byte, 8192)
			for i := range 400 {
				off := w*region + r.IntN(region/4096-1)*4096
				for j := range buf {
					buf[j] = byte(i + j + w)
				}
				if i%10 == 9 {
					if err := u.Trim(int64(off), 4096); err != nil {
						errs <- err
						return
					}
					clear(model[off : off+4096])
					continue
				}
				if _, err := u.WriteAt(buf, int64(off)); err != nil {
					errs <- err
					return
				}
				copy(model[off:], buf)
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	last := bytes.Repeat([]byte{0xee}, 4096) // after the last flush
	if _, err := u.WriteAt(last, writers*region-4096); err != nil {
		t.Fatal(err)
	}
	copy(model[writers*region-4096:], last)
	died(u)
	if u, err = OpenUpper(dp, ip, false); err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if got := readUpper(t, u); !bytes.Equal(got, model) {
		t.Fatalf("after the process died the upper reads %s, want every answered write", diffAt(got, model))
	}
}
