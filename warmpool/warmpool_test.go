package warmpool

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/store"
)

// TestNextWatermarks: a key below Low fills until High, one at a time, and
// no fill takes the entries past ReserveMiB.
func TestNextWatermarks(t *testing.T) {
	t.Parallel()
	p := New(Options{Low: 1, High: 3, ReserveMiB: 1024})
	p.keys["a"] = &keyState{memMiB: 256}
	now := time.Now()
	fill := func() string {
		key, _, _ := p.next(now)
		if key != "" {
			p.keys[key].ready = append(p.keys[key].ready, &Entry{})
		}
		return key
	}
	var got []string
	for range 5 {
		got = append(got, fill())
	}
	if !slices.Equal(got, []string{"a", "a", "a", "", ""}) {
		t.Fatalf("fills from empty: %q, want three then none", got)
	}
	// Two taken: 1 left, not below Low: no refill until it goes too.
	p.keys["a"].ready = p.keys["a"].ready[:1]
	if key := fill(); key != "" {
		t.Fatalf("a key at its low watermark fills %q", key)
	}
	p.keys["a"].ready = nil
	if key := fill(); key != "a" {
		t.Fatalf("a key below its low watermark does not fill")
	}
	// A second key: 256 MiB held by a, 3 more entries fit in 1024.
	p.keys["b"] = &keyState{memMiB: 512}
	for range 4 {
		fill()
	}
	if r := p.reservedLocked(); r > 1024 {
		t.Fatalf("the entries hold %d MiB, over the 1024 reserved", r)
	}
	if key, _, _ := p.next(now); key != "" {
		t.Fatalf("a fill of %q past the reservation (%d MiB held)", key, p.reservedLocked())
	}
	// One fill at a time.
	p.keys["c"] = &keyState{memMiB: 1}
	p.starting = 1
	if key, _, _ := p.next(now); key != "" {
		t.Fatalf("a second fill (%q) while one runs", key)
	}
}

// TestNextBacksOff: after failed fills a key waits before its next one.
func TestNextBacksOff(t *testing.T) {
	t.Parallel()
	p := New(Options{Low: 1, High: 1, ReserveMiB: 1024})
	now := time.Now()
	p.keys["a"] = &keyState{memMiB: 1, failures: 3, retryAt: now.Add(4 * time.Second)}
	key, _, wait := p.next(now)
	if key != "" || wait <= 0 || wait > 4*time.Second {
		t.Fatalf("a key backing off: fill %q, wait %s", key, wait)
	}
	if key, _, _ := p.next(now.Add(5 * time.Second)); key != "a" {
		t.Fatalf("after its backoff the key does not fill")
	}
	if backoff(1) != time.Second || backoff(30) != maxBackoff {
		t.Fatalf("backoff %s, %s", backoff(1), backoff(30))
	}
}

// TestNextYieldsToTakers: while a create that took an entry runs, the
// refill waits (its VMM start would take CPU from the create's guest), at
// most maxYield.
func TestNextYieldsToTakers(t *testing.T) {
	t.Parallel()
	p := New(Options{Low: 1, High: 1, ReserveMiB: 1024})
	p.keys["a"] = &keyState{memMiB: 1, ready: []*Entry{{Record: Record{ID: "pool-1"}}}}
	e := p.Take("a")
	if e == nil || e.ID != "pool-1" {
		t.Fatalf("take: %+v", e)
	}
	now := time.Now()
	if key, _, wait := p.next(now); key != "" || wait <= 0 || wait > maxYield {
		t.Fatalf("while the taker runs: fill %q, wait %s", key, wait)
	}
	if key, _, _ := p.next(now.Add(maxYield + time.Second)); key != "a" {
		t.Fatalf("past maxYield the refill still waits")
	}
	p.Done(e)
	if key, _, _ := p.next(now); key != "a" {
		t.Fatalf("after Done the refill still waits")
	}
}

// TestRecoverRemovesEverything: at startup every recorded entry is removed
// (through remove, then its record) and so is the pool's directory.
func TestRecoverRemovesEverything(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	poolDir := filepath.Join(dir, "pool")
	recs := []Record{{ID: "pool-a", State: Starting, Dir: filepath.Join(poolDir, "pool-a")},
		{ID: "pool-b", State: Ready, PID: 12345, HasDevice: true, Device: 7, Dir: filepath.Join(poolDir, "pool-b")}}
	for _, r := range recs {
		if err := st.Put(store.VMMPool, r.ID, r); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(r.Dir, "run"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var removed []string
	err = Recover(context.Background(), st, poolDir, func(_ context.Context, r Record) { removed = append(removed, r.ID) }, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"pool-a", "pool-b"}) {
		t.Fatalf("removed %v", removed)
	}
	left, err := store.ListAll[Record](st, store.VMMPool)
	if err != nil || len(left) != 0 {
		t.Fatalf("records after recovery: %v %v", left, err)
	}
	if _, err := os.Stat(poolDir); !os.IsNotExist(err) {
		t.Fatalf("the pool's directory after recovery: %v", err)
	}
}
