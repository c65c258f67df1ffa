package network_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/prometheus/client_golang/prometheus"
)

// waitFor polls cond until it holds; the deadline only guards against a
// hung test, it is not a performance assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countNamespaces(t *testing.T, prefix string) int {
	t.Helper()
	entries, err := os.ReadDir(network.NetNSDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if ok && rest != "host" && rest != "world" {
			n++
		}
	}
	return n
}

func TestWarmPoolWatermarks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	var prefix string
	m, _ := newManager(t, func(c *network.Config) {
		c.PoolLow, c.PoolHigh, c.Registerer = 2, 3, reg
		prefix = c.Prefix
	})
	waitFor(t, "the pool to fill to the low watermark", func() bool { return m.Stats().Pooled == 2 })

	var slots []*network.Slot
	for range 4 {
		slots = append(slots, acquire(t, m))
	}
	seen := map[int]bool{}
	for _, s := range slots {
		if seen[s.Index] {
			t.Fatalf("index %d handed out twice", s.Index)
		}
		seen[s.Index] = true
	}
	waitFor(t, "the pool to refill", func() bool { return m.Stats().Pooled == 2 })
	for _, s := range slots {
		if err := m.Release(t.Context(), s); err != nil {
			t.Fatalf("Release %s: %v", s.Name, err)
		}
	}
	// Out of use at once; scrubbed in the background.
	if st := m.Stats(); st.InUse != 0 {
		t.Fatalf("after release: %+v, want none in use", st)
	}
	// 2 warm + 4 released: the pool keeps 3 (high watermark), the worker
	// destroys the other 3.
	waitFor(t, "the released slots to be scrubbed", func() bool { return m.Stats().Pooled == 3 })
	waitFor(t, "slots above the high watermark to be destroyed", func() bool {
		return histogramCount(t, reg, "aenv_network_slot_destroy_seconds") == 3
	})
	if n := countNamespaces(t, prefix); n != 3 {
		t.Errorf("%d slot namespaces exist, want 3 (the pool)", n)
	}

	if got := gauge(t, reg, "aenv_network_pool_slots"); got != 3 {
		t.Errorf("pool gauge = %v, want 3", got)
	}
	if h := histogramCount(t, reg, "aenv_network_slot_create_seconds"); h < 6 {
		t.Errorf("create histogram has %d samples, want >= 6", h)
	}
}

func TestConcurrentAcquireRelease(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, func(c *network.Config) { c.PoolLow, c.PoolHigh = 1, 4 })
	const n = 8
	slots := make([]*network.Slot, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			s, err := m.Acquire(t.Context())
			if err != nil {
				errs <- err
				return
			}
			slots[i] = s
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Acquire: %v", err)
	}
	ips := map[string]bool{}
	for _, s := range slots {
		if ips[s.HostIP.String()] {
			t.Fatalf("host address %s handed out twice", s.HostIP)
		}
		ips[s.HostIP.String()] = true
	}
	for _, s := range slots[:n/2] {
		wg.Go(func() {
			if err := m.Release(t.Context(), s); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	wg.Wait()
	// The rest stays in use: Shutdown (in cleanup) must remove them too.
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func TestExhaustion(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, func(c *network.Config) {
		c.HostCIDR = netip.MustParsePrefix("10.200.0.0/30") // room for 2 slots
	})
	a, b := acquire(t, m), acquire(t, m)
	if _, err := m.Acquire(t.Context()); !errors.Is(err, network.ErrExhausted) {
		t.Fatalf("third Acquire: %v, want ErrExhausted", err)
	}
	if err := m.Release(t.Context(), a); err != nil { // destroyed: no pool
		t.Fatal(err)
	}
	waitFor(t, "the released index to come back", func() bool {
		s, err := m.Acquire(t.Context())
		if err != nil {
			return false
		}
		if s.HostIP == b.HostIP {
			t.Fatalf("address %s handed out twice", s.HostIP)
		}
		return true
	})
	if err := m.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(t.Context()); !errors.Is(err, network.ErrShutdown) {
		t.Fatalf("Acquire after Shutdown: %v, want ErrShutdown", err)
	}
	if err := a.SetPolicy(t.Context(), network.Policy{}); err == nil {
		t.Fatalf("SetPolicy on a destroyed slot succeeded")
	}
}

// TestReleaseDuringShutdown: a slot released while the manager shuts down
// is destroyed with the others (the cleanup checks nothing is left).
func TestReleaseDuringShutdown(t *testing.T) {
	t.Parallel()
	for range 5 {
		m, _ := newManager(t, func(c *network.Config) { c.PoolLow, c.PoolHigh = 0, 4 })
		slots := []*network.Slot{acquire(t, m), acquire(t, m), acquire(t, m)}
		var wg sync.WaitGroup
		for _, s := range slots {
			wg.Go(func() {
				if err := m.Release(t.Context(), s); err != nil {
					t.Errorf("Release: %v", err)
				}
			})
		}
		if err := m.Shutdown(t.Context()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		wg.Wait()
	}
}

// TestConcurrentTapLives plays many VM lives at once: acquire a slot, open
// its tap, hand it to a child process (as a VMM inherits it), close the
// node's copy, wait for the child, release. Other children are forked
// meanwhile. No slot is held twice at a time, and no tap is ever busy.
func TestConcurrentTapLives(t *testing.T) {
	m, _ := newManager(t, func(c *network.Config) { c.PoolLow, c.PoolHigh = 2, 4 })
	const workers, lives = 6, 15
	var mu sync.Mutex
	held := map[string]bool{}
	errc := make(chan error, workers)
	stop := make(chan struct{})
	var forks sync.WaitGroup
	forks.Add(1)
	go func() { // unrelated fork/execs, as the node runs all the time
		defer forks.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = exec.Command("true").Run()
			}
		}
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range lives {
				if err := tapLife(t.Context(), m, &mu, held); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	forks.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func tapLife(ctx context.Context, m *network.Manager, mu *sync.Mutex, held map[string]bool) error {
	s, err := m.Acquire(ctx)
	if err != nil {
		return err
	}
	mu.Lock()
	twice := held[s.Name]
	held[s.Name] = true
	mu.Unlock()
	if twice {
		return fmt.Errorf("slot %s handed out while in use", s.Name)
	}
	tap, err := s.OpenTap()
	if err != nil {
		return err
	}
	child := exec.Command("sleep", "0.02")
	child.ExtraFiles = []*os.File{tap}
	err = child.Start()
	tap.Close()
	if err == nil {
		err = child.Wait()
	}
	mu.Lock()
	delete(held, s.Name)
	mu.Unlock()
	return errors.Join(err, m.Release(ctx, s))
}
