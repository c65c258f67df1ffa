package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrShutdown is returned by Acquire after Shutdown.
var ErrShutdown = errors.New("network: manager is shut down")

// ErrExhausted is returned when every slot index is in use.
var ErrExhausted = errors.New("network: no free slot index")

// Manager owns a node's slots. It is safe for concurrent use; create one
// per process and prefix.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	hostNS netns.NsHandle // -1: the process's own namespace
	// denied is what no guest reaches: Config.AlwaysDenied, the slot
	// ranges and the host's own addresses at New.
	denied []ipRange
	hostMu sync.Mutex // serialises hostNL
	hostNL *netlink.Handle

	mu       sync.Mutex
	closed   bool
	freeIdx  []int // released indexes, reused first, oldest first
	nextIdx  int
	pool     []*Slot
	inUse    map[*Slot]struct{}
	creating int
	doomed   []*Slot      // released above the high watermark, destroyed by the worker
	kept     map[int]bool // Config.Keep indexes not adopted (nor forgotten) yet
	detached map[int]bool // slots handed over to the next process (Detach): Shutdown leaves them
	reserved map[int]bool // Config.Keep: never handed out as new indexes (they come back through freeIdx)

	wake   chan struct{}
	stop   chan struct{}
	worker sync.WaitGroup
	// releasing counts the scrubs of released slots in flight: Shutdown
	// waits for them, so a slot released during Shutdown is destroyed too.
	releasing sync.WaitGroup
}

// New cleans up what a previous process with the same prefix left, sets up
// the host namespace and starts the warm-pool worker.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, log: cfg.Logger.With("component", "network", "prefix", cfg.Prefix),
		hostNS: -1, nextIdx: 1, inUse: map[*Slot]struct{}{}, kept: map[int]bool{}, reserved: map[int]bool{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	for _, i := range cfg.Keep {
		m.kept[i], m.reserved[i] = true, true
	}
	m.metrics = newMetrics(cfg.Prefix, cfg.Registerer)
	if err := m.openHost(); err != nil {
		return nil, err
	}
	if n, err := Cleanup(ctx, cfg); err != nil {
		m.closeHost()
		return nil, err
	} else if n > 0 {
		m.log.Info("removed leftovers of a previous run", "objects", n)
	}
	if err := m.setupHost(); err != nil {
		m.closeHost()
		return nil, err
	}
	if err := m.computeDenied(); err != nil {
		m.closeHost()
		return nil, err
	}
	m.worker.Add(1)
	go m.runWorker()
	m.kick()
	return m, nil
}

func (m *Manager) openHost() error {
	ns := netns.None()
	if m.cfg.HostNetNS != "" {
		h, err := netns.GetFromPath(m.cfg.HostNetNS)
		if err != nil {
			return fmt.Errorf("open host netns %s: %w", m.cfg.HostNetNS, err)
		}
		ns, m.hostNS = h, h
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		m.closeHost()
		return fmt.Errorf("netlink in host netns: %w", err)
	}
	m.hostNL = h
	return nil
}

func (m *Manager) closeHost() {
	if m.hostNL != nil {
		m.hostNL.Close()
	}
	if m.hostNS >= 0 {
		m.hostNS.Close()
	}
}

func (m *Manager) hostNFT() (*nftables.Conn, error) {
	if m.hostNS < 0 {
		return nftables.New()
	}
	return nftables.New(nftables.WithNetNSFd(int(m.hostNS)))
}

func (m *Manager) setupHost() error {
	err := runInNS(m.cfg.HostNetNS, func() error { return writeSysctl("net/ipv4/ip_forward", "1") })
	if err != nil {
		return fmt.Errorf("host setup: %w", err)
	}
	c, err := m.hostNFT()
	if err != nil {
		return fmt.Errorf("host setup: %w", err)
	}
	return installHostTable(c, &m.cfg)
}

// computeDenied gathers the always-denied ranges: the configured list, the
// slot ranges themselves and every address the host namespace has now.
func (m *Manager) computeDenied() error {
	ps := append([]netip.Prefix{m.cfg.HostCIDR, m.cfg.VethCIDR}, m.cfg.AlwaysDenied...)
	m.hostMu.Lock()
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return m.hostNL.AddrList(nil, netlink.FAMILY_V4) })
	m.hostMu.Unlock()
	if err != nil {
		return fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			ps = append(ps, netip.PrefixFrom(ip, 32))
		}
	}
	m.denied = prefixesToRanges(ps)
	return nil
}

// dumpRetries bounds the retries of a netlink dump the kernel reports as
// interrupted by a concurrent change (netlink.ErrDumpInterrupted).
const dumpRetries = 30

// retryDump runs a netlink dump until it is not interrupted by concurrent
// changes (links of other slots come and go all the time on a busy node).
func retryDump[T any](dump func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return v, err
		}
		if i > 3 {
			time.Sleep(time.Duration(i) * time.Millisecond)
		}
	}
}

// Acquire returns a slot with the default policy: a warm one when the pool
// has one, else a new one.
func (m *Manager) Acquire(ctx context.Context) (*Slot, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrShutdown
	}
	if n := len(m.pool); n > 0 {
		s := m.pool[n-1]
		m.pool = m.pool[:n-1]
		m.inUse[s] = struct{}{}
		m.metrics.setPool(len(m.pool), len(m.inUse))
		m.mu.Unlock()
		m.metrics.acquired("pool")
		m.kick()
		return s, nil
	}
	m.mu.Unlock()
	s, err := m.create(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		m.mu.Unlock()
		m.destroy(s)
		m.mu.Lock()
		return nil, ErrShutdown
	}
	m.inUse[s] = struct{}{}
	m.metrics.setPool(len(m.pool), len(m.inUse))
	m.metrics.acquired("created")
	m.kick()
	return s, nil
}

// Detach hands a slot in use over to the next process of the node: Shutdown
// leaves its namespace, veth and tap in place (the VM using it runs on), and
// the next manager takes it back through Config.Keep and Adopt. The slot
// must not be used after.
func (m *Manager) Detach(s *Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.inUse, s)
	if m.detached == nil {
		m.detached = map[int]bool{}
	}
	m.detached[s.Index] = true
	m.metrics.setPool(len(m.pool), len(m.inUse))
	if s.dns != nil {
		s.dns.close() // this process's resolver goes; Adopt starts the next one's
	}
}

// Release takes a slot out of use once the VM using it stopped (the
// caller must have stopped it) and scrubs it (default policy, no resolved
// addresses, no connection state) in the background: the scrub is most of
// a release's time (~20 ms of netlink work) and nothing the caller does
// next needs it. A scrubbed slot goes back to the pool, or to the worker
// for destruction when the pool is at its high watermark or the scrub
// failed; no slot is handed out before its scrub ended. Shutdown waits for
// the scrubs in flight.
func (m *Manager) Release(ctx context.Context, s *Slot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed { // Shutdown destroys (or destroyed) it with the other slots in use
		return nil
	}
	if _, ok := m.inUse[s]; !ok {
		return fmt.Errorf("release slot %s: not in use", s.Name)
	}
	delete(m.inUse, s)
	m.metrics.setPool(len(m.pool), len(m.inUse))
	m.releasing.Add(1)
	go m.scrub(context.WithoutCancel(ctx), s)
	return nil
}

// scrub scrubs a released slot and returns it to the pool, or dooms it.
func (m *Manager) scrub(ctx context.Context, s *Slot) {
	defer m.releasing.Done()
	err := s.scrub(ctx)
	if err != nil {
		m.log.Warn("scrub released slot (destroyed instead of pooled)", "slot", s.Name, "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil || m.closed || len(m.pool) >= m.cfg.PoolHigh:
		m.doomed = append(m.doomed, s)
	default:
		m.pool = append(m.pool, s)
	}
	m.metrics.setPool(len(m.pool), len(m.inUse))
	m.kick()
}

// Shutdown stops the worker and destroys every slot, pooled or in use, and
// the host rules. The manager is unusable afterwards.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	m.worker.Wait()
	m.releasing.Wait()

	m.mu.Lock()
	all := append(append([]*Slot(nil), m.pool...), m.doomed...)
	for s := range m.inUse {
		all = append(all, s)
	}
	for i := range m.kept {
		all = append(all, m.newSlot(i))
	}
	m.pool, m.doomed, m.inUse, m.kept = nil, nil, map[*Slot]struct{}{}, nil
	m.metrics.setPool(0, 0)
	m.mu.Unlock()

	var errs []error
	for _, s := range all {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		errs = append(errs, m.destroy(s))
	}
	errs = append(errs, m.awaitHostVeths(ctx))
	if c, err := m.hostNFT(); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, deleteHostTable(c, m.cfg.Prefix))
	}
	m.closeHost()
	return errors.Join(errs...)
}

// awaitHostVeths waits until the kernel has dismantled the host veths of
// the destroyed namespaces, and deletes any that outlive a short grace
// period, so that Shutdown leaves nothing behind when it returns.
// isDetachedVeth reports whether a host veth belongs to a slot handed over
// to the next process (Detach).
func (m *Manager) isDetachedVeth(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, err := strconv.Atoi(strings.TrimPrefix(name, m.cfg.Prefix+"v"))
	return err == nil && m.detached[i]
}

func (m *Manager) awaitHostVeths(ctx context.Context) error {
	grace := time.Now().Add(5 * time.Second)
	for {
		left, err := m.hostVeths()
		left = slices.DeleteFunc(left, m.isDetachedVeth)
		if err != nil || len(left) == 0 {
			return err
		}
		if time.Now().After(grace) || ctx.Err() != nil {
			var errs []error
			for _, name := range left {
				errs = append(errs, m.hostLinkDel(name))
			}
			return errors.Join(errs...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (m *Manager) hostVeths() ([]string, error) {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	links, err := retryDump(m.hostNL.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list host links: %w", err)
	}
	var names []string
	for _, l := range links {
		if isSlotVeth(m.cfg.Prefix, l.Attrs().Name) {
			names = append(names, l.Attrs().Name)
		}
	}
	return names, nil
}

// Stats is a snapshot of the manager's slot counts.
type Stats struct{ Pooled, InUse int }

// Stats returns the current slot counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{Pooled: len(m.pool), InUse: len(m.inUse)}
}

func (m *Manager) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// create builds a slot on a fresh index.
func (m *Manager) create(ctx context.Context) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create slot: %w", err)
	}
	idx, err := m.allocIndex()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	s := m.newSlot(idx)
	if err := s.build(ctx); err != nil {
		m.destroy(s)
		return nil, fmt.Errorf("create slot %s: %w", s.Name, err)
	}
	m.metrics.createSeconds.Observe(time.Since(start).Seconds())
	return s, nil
}

func (m *Manager) destroy(s *Slot) error {
	start := time.Now()
	err := s.destroy()
	m.metrics.destroySeconds.Observe(time.Since(start).Seconds())
	m.mu.Lock()
	m.freeIdx = append(m.freeIdx, s.Index)
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("destroy slot", "slot", s.Name, "err", err)
	}
	return err
}

func (m *Manager) allocIndex() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Oldest first: the kernel may still be dismantling a recent one's veth.
	if len(m.freeIdx) > 0 {
		idx := m.freeIdx[0]
		m.freeIdx = m.freeIdx[1:]
		return idx, nil
	}
	for m.reserved[m.nextIdx] {
		m.nextIdx++
	}
	if m.nextIdx > m.cfg.maxSlots() {
		return 0, ErrExhausted
	}
	m.nextIdx++
	return m.nextIdx - 1, nil
}

// runWorker is the single background worker: it destroys slots released
// above the high watermark and refills the pool up to the low watermark.
func (m *Manager) runWorker() {
	defer m.worker.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-m.stop; cancel() }()
	var retry <-chan time.Time
	for {
		select {
		case <-m.stop:
			return
		case <-m.wake:
		case <-retry:
		}
		retry = nil
		m.drainDoomed()
		if err := m.refill(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("warm pool refill", "err", err)
			retry = time.After(time.Second)
		}
	}
}

func (m *Manager) drainDoomed() {
	m.mu.Lock()
	doomed := m.doomed
	m.doomed = nil
	m.mu.Unlock()
	for _, s := range doomed {
		m.destroy(s)
	}
}

func (m *Manager) refill(ctx context.Context) error {
	for {
		m.mu.Lock()
		need := !m.closed && len(m.pool) < m.cfg.PoolLow
		m.mu.Unlock()
		if !need || ctx.Err() != nil {
			return nil
		}
		s, err := m.create(ctx)
		if err != nil {
			return err
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			m.destroy(s)
			return nil
		}
		m.pool = append(m.pool, s)
		m.metrics.setPool(len(m.pool), len(m.inUse))
		m.mu.Unlock()
	}
}

// ---- host namespace operations ----
