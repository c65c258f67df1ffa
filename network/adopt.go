package network

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Adopt takes over a slot of Config.Keep that a previous process left in
// use by a VM still running: its namespace, veth and tap stay as they are;
// its rules are installed afresh with the default policy (set the
// sandbox's policy next) and its DNS resolver, which died with the old
// process, is started again. The slot is then in use, to be Released as
// any other. On failure the slot is destroyed.
func (m *Manager) Adopt(ctx context.Context, index int) (*Slot, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("adopt slot %d: manager shut down", index)
	}
	if !m.kept[index] {
		m.mu.Unlock()
		return nil, fmt.Errorf("adopt slot %d: not among the kept slots", index)
	}
	delete(m.kept, index)
	m.mu.Unlock()
	s := m.newSlot(index)
	if err := s.adopt(ctx); err != nil {
		m.destroy(s)
		return nil, fmt.Errorf("adopt slot %s: %w", s.Name, err)
	}
	m.mu.Lock()
	m.inUse[s] = struct{}{}
	m.metrics.setPool(len(m.pool), len(m.inUse))
	m.mu.Unlock()
	m.log.Info("adopted slot", "slot", s.Name)
	return s, nil
}

// Forget destroys a kept slot that will not be adopted (its VM is gone).
func (m *Manager) Forget(index int) error {
	m.mu.Lock()
	if !m.kept[index] {
		m.mu.Unlock()
		return nil
	}
	delete(m.kept, index)
	m.mu.Unlock()
	return m.destroy(m.newSlot(index))
}

func (s *Slot) adopt(ctx context.Context) error {
	if err := s.openNS(); err != nil {
		return err
	}
	if err := s.m.hostVethExists(s.HostVeth); err != nil {
		return err
	}
	if err := s.m.hostRPFilter(s.HostVeth); err != nil {
		return err
	}
	c, err := s.nft()
	if err != nil {
		return err
	}
	c.DelTable(s.table.table)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("drop the old rules: %w", err)
	}
	if err := s.installRules(); err != nil {
		return err
	}
	// Slots made by an older version may lack it.
	if err := runInHandle(s.ns, setRPFilter); err != nil {
		return err
	}
	s.dns = newResolver(s)
	if err := runInHandle(s.ns, s.dns.listen); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	if err := s.m.hostRouteAdd(s); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	s.dns.start(ctx)
	return nil
}
