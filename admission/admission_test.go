package admission

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/errdefs"
)

func TestAdmitRefusesEachLimit(t *testing.T) {
	lim := Limits{MaxSandboxes: 3, MaxCommittedMiB: 2048, DiskReserveBytes: 100 << 20, DataDir: "/data",
		MaxForkChildren: 4, RetryAfter: 7 * time.Second}
	cases := []struct {
		name  string
		req   Request
		usage Usage
		free  int64
		kind  error // nil: admitted
		limit string
		msg   []string
	}{
		{name: "within every limit", req: Request{Op: "create", Sandboxes: 1, MemoryMiB: 512},
			usage: Usage{Sandboxes: 1, MemoryMiB: 512, PoolMiB: 512}, free: 1 << 30},
		{name: "sandbox count", req: Request{Op: "create", Sandboxes: 1, MemoryMiB: 64},
			usage: Usage{Sandboxes: 3, MemoryMiB: 192}, free: 1 << 30, kind: errdefs.ErrLimit, limit: "max_sandboxes",
			msg: []string{"create refused", "3 sandboxes running", "limit 3", "max_sandboxes"}},
		{name: "committed memory counts the warm pool", req: Request{Op: "resume", Sandboxes: 1, MemoryMiB: 512},
			usage: Usage{Sandboxes: 1, MemoryMiB: 1024, PoolMiB: 1024}, free: 1 << 30, kind: errdefs.ErrCapacity,
			limit: "max_committed_mib", msg: []string{"resume refused", "512 MiB asked", "2048 MiB committed",
				"1024 warm pool", "limit 2048 MiB"}},
		{name: "disk reserve", req: Request{Op: "create", Sandboxes: 1, MemoryMiB: 512}, free: 50 << 20,
			kind: errdefs.ErrCapacity, limit: "disk_reserve_mib", msg: []string{"50 MiB free on /data", "reserve 100 MiB"}},
		{name: "fork children", req: Request{Op: "fork", ForkChildren: 5}, free: 1 << 30, kind: errdefs.ErrLimit,
			limit: "max_fork_children", msg: []string{"fork refused", "5 fork children asked", "limit 4"}},
		{name: "a fork itself starts nothing", req: Request{Op: "fork", ForkChildren: 4},
			usage: Usage{Sandboxes: 3, MemoryMiB: 2048}, free: 0},
		// A memory resize asks for its growth only: no sandbox, so neither
		// the count nor the disk reserve applies.
		{name: "a resize's growth within the memory limit", req: Request{Op: "resize", MemoryMiB: 256},
			usage: Usage{Sandboxes: 3, MemoryMiB: 1792}, free: 0},
		{name: "a resize's growth beyond the memory limit", req: Request{Op: "resize", MemoryMiB: 257},
			usage: Usage{Sandboxes: 3, MemoryMiB: 1792}, free: 1 << 30, kind: errdefs.ErrCapacity,
			limit: "max_committed_mib", msg: []string{"resize refused", "257 MiB asked", "1792 MiB committed", "limit 2048 MiB"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New(lim)
			c.statfs = func(dir string) (int64, error) {
				if dir != "/data" {
					t.Errorf("statfs of %q, want the data directory", dir)
				}
				return tc.free, nil
			}
			release, err := c.Admit(context.Background(), tc.req, func() Usage { return tc.usage })
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				release()
				return
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err %v, want %v", err, tc.kind)
			}
			var r *Refusal
			if !errors.As(err, &r) || r.Limit != tc.limit || r.RetryAfter() != 7*time.Second {
				t.Fatalf("refusal %+v, want limit %s with retry 7s", r, tc.limit)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message %q lacks %q", err, m)
				}
			}
			if _, n := c.InFlight(); n != 0 {
				t.Errorf("a refusal left %d reservations", n)
			}
		})
	}
}

// Reservations in flight count against the limits until released, and a
// release (idempotent) frees exactly its own.
func TestAdmitCountsInFlightUntilRelease(t *testing.T) {
	c := New(Limits{MaxSandboxes: 2, MaxCommittedMiB: 1024, MaxForkChildren: 3})
	ctx := context.Background()
	none := func() Usage { return Usage{} }
	r1, err := c.Admit(ctx, Request{Op: "create", Sandboxes: 1, MemoryMiB: 512}, none)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Admit(ctx, Request{Op: "create", Sandboxes: 1, MemoryMiB: 512}, none)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(ctx, Request{Op: "create", Sandboxes: 1, MemoryMiB: 1}, none); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("third create with two in flight: %v, want the count limit", err)
	}
	r1()
	r1() // idempotent: must not free r2's reservation
	if f, n := c.InFlight(); n != 1 || f.MemoryMiB != 512 || f.Sandboxes != 1 {
		t.Fatalf("in flight after one release: %+v (%d), want one of 512 MiB", f, n)
	}
	if _, err := c.Admit(ctx, Request{Op: "create", Sandboxes: 1, MemoryMiB: 513}, none); !errors.Is(err, errdefs.ErrCapacity) {
		t.Fatalf("513 MiB beside 512 in flight under 1024: %v, want the memory limit", err)
	}
	r3, err := c.Admit(ctx, Request{Op: "create", Sandboxes: 1, MemoryMiB: 512}, none)
	if err != nil {
		t.Fatalf("create after a release: %v", err)
	}
	f1, err := c.Admit(ctx, Request{Op: "fork", ForkChildren: 3}, none)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(ctx, Request{Op: "fork", ForkChildren: 1}, none); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("fork beside 3 children in flight: %v, want the fork limit", err)
	}
	f1()
	r2()
	r3()
	if f, n := c.InFlight(); n != 0 || f != (Request{}) {
		t.Fatalf("after every release: %+v (%d), want nothing", f, n)
	}
}

// Concurrent callers never hold more than the limits allow, whatever the
// interleaving (run under -race).
func TestAdmitConcurrentNeverExceeds(t *testing.T) {
	const maxN, maxMiB = 3, 3 * 256
	c := New(Limits{MaxSandboxes: maxN, MaxCommittedMiB: maxMiB})
	var held, mem, peak, peakMem atomic.Int64
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				release, err := c.Admit(context.Background(), Request{Op: "create", Sandboxes: 1, MemoryMiB: 128 + 128*(i%2)}, nil)
				if err != nil {
					refused.Add(1)
					continue
				}
				admitted.Add(1)
				n, m := held.Add(1), mem.Add(int64(128+128*(i%2)))
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				for p := peakMem.Load(); m > p && !peakMem.CompareAndSwap(p, m); p = peakMem.Load() {
				}
				held.Add(-1)
				mem.Add(-int64(128 + 128*(i%2)))
				release()
			}
		}()
	}
	wg.Wait()
	if peak.Load() > maxN || peakMem.Load() > maxMiB {
		t.Fatalf("held %d sandboxes and %d MiB at once, limits %d and %d", peak.Load(), peakMem.Load(), maxN, maxMiB)
	}
	if admitted.Load() == 0 {
		t.Fatal("nothing admitted")
	}
	if _, n := c.InFlight(); n != 0 {
		t.Fatalf("%d reservations left after every release", n)
	}
}

func TestFromConfig(t *testing.T) {
	def := config.Default().Admission
	l := FromConfig(def, "/var/lib/aenv", 24<<10)
	if l.MaxCommittedMiB != 22<<10 || l.MaxSandboxes != def.MaxSandboxes || l.DiskReserveBytes != 2<<30 {
		t.Fatalf("defaults on a 24 GiB host: %+v, want 22 GiB committed, 2 GiB disk reserve", l)
	}
	over := def
	over.MemoryOvercommitPct = 150
	if l := FromConfig(over, "", 10<<10); l.MaxCommittedMiB != (8<<10)*3/2 {
		t.Fatalf("150%% of 8 GiB: %d MiB", l.MaxCommittedMiB)
	}
	fixed := def
	fixed.MaxCommittedMiB = 1000
	if l := FromConfig(fixed, "", 24<<10); l.MaxCommittedMiB != 1000 {
		t.Fatalf("explicit max_committed_mib: %d", l.MaxCommittedMiB)
	}
	if l := FromConfig(def, "", 1024); l.MaxCommittedMiB != 1 {
		t.Fatalf("host smaller than its reserve: %d MiB, want admitting no guest memory", l.MaxCommittedMiB)
	}
	if l := FromConfig(def, "", 0); l.MaxCommittedMiB != 0 {
		t.Fatalf("unknown host memory: %d, want no derived limit", l.MaxCommittedMiB)
	}
	if mib, err := HostMemoryMiB(); err != nil || mib <= 0 {
		t.Fatalf("host memory: %d, %v", mib, err)
	}
}

func TestFreeBytes(t *testing.T) {
	if free, err := freeBytes(t.TempDir()); err != nil || free <= 0 {
		t.Fatalf("free bytes of a temporary directory: %d, %v", free, err)
	}
	if _, err := freeBytes("/nonexistent/dir"); err == nil {
		t.Fatal("statfs of a missing directory succeeded")
	}
}

// TestAdmitCountsVMMOverhead: with a VMM overhead, every running, starting
// and asked sandbox commits its guest memory plus the overhead, so calls a
// guest-memory-only count would admit are refused, naming the overhead.
func TestAdmitCountsVMMOverhead(t *testing.T) {
	usage := func() Usage { return Usage{Sandboxes: 2, MemoryMiB: 512} }
	req := Request{Op: "create", Sandboxes: 1, MemoryMiB: 256}
	plain := New(Limits{MaxCommittedMiB: 2048})
	release, err := plain.Admit(context.Background(), req, usage)
	if err != nil {
		t.Fatalf("without an overhead 512+256 MiB of 2048 is refused: %v", err)
	}
	release()

	c := New(Limits{MaxCommittedMiB: 2048, VMMOverheadMiB: 256})
	first, err := c.Admit(context.Background(), req, usage) // 512+2*256 running, 256+256 asked: 1536
	if err != nil {
		t.Fatalf("1536 MiB of 2048 refused: %v", err)
	}
	defer first()
	_, err = c.Admit(context.Background(), req, usage) // 1536 committed with the first in flight, 512 more: 2048
	if err != nil {
		t.Fatalf("2048 MiB of 2048 refused: %v", err)
	}
	_, err = c.Admit(context.Background(), req, usage)
	if !errors.Is(err, errdefs.ErrCapacity) || !strings.Contains(err.Error(), "512 MiB asked (guest memory and 256 MiB for its VMM)") ||
		!strings.Contains(err.Error(), "2048 MiB committed") {
		t.Fatalf("a third create over the overhead-counted limit: %v", err)
	}
}
