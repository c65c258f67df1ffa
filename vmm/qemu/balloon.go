package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"golang.org/x/sys/unix"
)

// Memory resize. QEMU 7.2's microvm machine cannot use virtio-mem: the
// virtio-mmio variant is no memory device, and virtio-mem-pci (microvm with
// pcie=on) is given no device-memory region to plug into, so the guest's
// driver fails to reserve one (docs/architecture.md, "Memory resize"). A
// virtio-balloon device works on virtio-mmio: the guest hands pages to the
// host below the RAM the machine started with, and takes them back.

// balloonDevice is the balloon of specVersion 3 machines. deflate-on-oom
// off: the guest's driver then takes what it hands over out of its managed
// memory, so /proc/meminfo's MemTotal shows the size the sandbox was given,
// and an out-of-memory guest does not quietly grow past it.
const balloonDevice = "virtio-balloon-device,id=" + balloonID + ",deflate-on-oom=off"

// balloonID names the balloon device (its QOM path, for its statistics).
const balloonID = "balloon"

var _ vmm.Resizer = (*machine)(nil)

// hasBalloon reports whether m was started with the balloon device.
func (m *machine) hasBalloon() error {
	if m.spec == nil || m.spec.Version < 3 {
		return fmt.Errorf("vm %s: memory resize of a machine without a balloon device (snapshot config version %d): %w", m.id, m.specVersion(), vmm.ErrUnsupported)
	}
	return m.alive()
}

func (m *machine) specVersion() int {
	if m.spec == nil {
		return 0
	}
	return m.spec.Version
}

// SetMemory implements vmm.Resizer (QMP balloon: the guest's target size).
func (m *machine) SetMemory(ctx context.Context, targetMiB int) error {
	if err := m.hasBalloon(); err != nil {
		return err
	}
	if targetMiB <= 0 || targetMiB > m.spec.MemoryMiB {
		return fmt.Errorf("vm %s: memory target %d MiB outside 1 to %d MiB", m.id, targetMiB, m.spec.MemoryMiB)
	}
	if targetMiB < m.spec.MemoryMiB && !m.mem.shared {
		if err := refusesHoles(m.mem.path); err != nil {
			return fmt.Errorf("vm %s: shrink memory: %w", m.id, err)
		}
	}
	args := map[string]int64{"value": int64(targetMiB) << 20}
	if err := m.qmp.Execute(ctx, "balloon", args, nil); err != nil {
		return fmt.Errorf("vm %s: set memory to %d MiB: %w", m.id, targetMiB, err)
	}
	return nil
}

// Memory implements vmm.Resizer (QMP query-balloon).
func (m *machine) Memory(ctx context.Context) (int, error) {
	if err := m.hasBalloon(); err != nil {
		return 0, err
	}
	var info struct {
		Actual int64 `json:"actual"`
	}
	if err := m.qmp.Execute(ctx, "query-balloon", nil, &info); err != nil {
		return 0, fmt.Errorf("vm %s: query memory: %w", m.id, err)
	}
	return int(info.Actual >> 20), nil
}

// statsWait bounds how long Available waits for the guest's report.
const statsWait = 10 * time.Second

// Available implements vmm.Resizer: the balloon's guest statistics,
// asked for once (their polling is on only while Available waits, so an
// idle guest is not woken for them).
func (m *machine) Available(ctx context.Context) (int, error) {
	if err := m.hasBalloon(); err != nil {
		return 0, err
	}
	path := "/machine/peripheral/" + balloonID
	before, _, err := m.guestStats(ctx, path)
	if err != nil {
		return 0, err
	}
	setPoll := func(ctx context.Context, seconds int) error {
		return m.qmp.Execute(ctx, "qom-set", map[string]any{"path": path, "property": "guest-stats-polling-interval", "value": seconds}, nil)
	}
	if err := setPoll(ctx, 1); err != nil {
		return 0, fmt.Errorf("vm %s: ask for guest memory statistics: %w", m.id, err)
	}
	defer func() { _ = setPoll(context.WithoutCancel(ctx), 0) }()
	ctx, cancel := context.WithTimeout(ctx, statsWait)
	defer cancel()
	for {
		at, avail, err := m.guestStats(ctx, path)
		if err != nil {
			return 0, err
		}
		if at != before {
			if avail < 0 {
				return 0, fmt.Errorf("vm %s: the guest reports no available memory", m.id)
			}
			return int(avail >> 20), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("vm %s: guest memory statistics: no report: %w", m.id, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// guestStats reads the balloon's last guest statistics: when they came
// and the guest's available memory in bytes (-1: not reported).
func (m *machine) guestStats(ctx context.Context, path string) (at, avail int64, err error) {
	var st struct {
		Stats struct {
			Available int64 `json:"stat-available-memory"`
		} `json:"stats"`
		LastUpdate int64 `json:"last-update"`
	}
	if err := m.qmp.Execute(ctx, "qom-get", map[string]any{"path": path, "property": "guest-stats"}, &st); err != nil {
		return 0, 0, fmt.Errorf("vm %s: guest memory statistics: %w", m.id, err)
	}
	return st.LastUpdate, st.Stats.Available, nil
}

// refusesHoles checks that the file a restored machine maps its RAM from
// privately refuses hole punches. QEMU 7.2 gives a page the guest's
// balloon takes back to the host by punching a hole in the RAM's file
// (ram_block_discard_range) whether the mapping is shared or private, and
// a restored machine's file is a memory image other machines map too (a
// template's, a fork's): a hole there would zero that page in every one of
// them. The storage daemon's FUSE memory files refuse every change (EPERM),
// so QEMU's punch fails and leaves the host's copy in place (the guest
// still gives the page up); a plain file would take it, and the shrink is
// refused. The probe punches past the end of the file, which changes
// nothing where it is allowed.
func refusesHoles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("probe memory file %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("probe memory file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("guest RAM mapped privately from device %s, which QEMU's balloon would punch holes into: %w", path, vmm.ErrUnsupported)
	}
	end := (st.Size() + pageSize - 1) / pageSize * pageSize
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, end, pageSize)
	switch {
	case err == nil:
		return fmt.Errorf("guest RAM mapped privately from %s, a memory image other machines may map, which QEMU's balloon would punch holes into: %w", path, vmm.ErrUnsupported)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
		return nil
	default:
		return fmt.Errorf("probe memory file %s: %w", path, err)
	}
}
