package lifecycle

import (
	"context"
	"log/slog"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// adopted is a sandbox recovery settles after a restart: its record as the
// crash left it and, when recovery took it over, its VMM.
type adopted struct {
	rec   sandbox.Record
	m     vmm.Machine
	j     *sandbox.Journal
	disks *disk.Manager
	log   *slog.Logger
}

// Adopted wraps the record of a sandbox a restart found, and its VMM m
// when recovery took it over (nil: none), for the verbs. Its record is
// written through j (recovery's journal) and its devices deleted through
// disks.
func Adopted(rec sandbox.Record, m vmm.Machine, j *sandbox.Journal, disks *disk.Manager, log *slog.Logger) Sandbox {
	return &adopted{rec: rec, m: m, j: j, disks: disks, log: log}
}

func (a *adopted) Record() sandbox.Record { return a.rec }
func (a *adopted) Machine() vmm.Machine   { return a.m }
func (a *adopted) Slot() *network.Slot    { return nil }
func (a *adopted) Adopted() bool          { return true }

func (a *adopted) Transition(to sandbox.State, change func(*sandbox.Record)) error {
	return a.j.Transition(a.rec, to, change, func(n sandbox.Record) { a.rec = n })
}

func (a *adopted) Update(change func(*sandbox.Record)) error {
	next := a.rec
	change(&next)
	if err := a.j.Put(next); err != nil {
		return err
	}
	a.rec = next
	return nil
}

func (a *adopted) Set(change func(*sandbox.Record)) { change(&a.rec) }

// StopVM stops the adopted VMM, or kills the process the record names
// when none was adopted (it may have outlived the previous run).
func (a *adopted) StopVM(ctx context.Context) {
	if a.m != nil {
		if err := a.m.Stop(ctx); err != nil {
			a.log.Warn("stop adopted machine", "sandbox", a.rec.ID, "err", err)
		}
		a.m = nil
	} else if a.rec.PID != 0 {
		vmmproc.Kill(a.rec.PID, a.rec.PIDStart)
	}
	a.rec.PID, a.rec.PIDStart, a.rec.Slot = 0, 0, 0
}

func (a *adopted) ReleaseDevices(ctx context.Context) {
	if err := a.disks.DeleteRecordDevices(ctx, a.rec); err != nil {
		a.log.Warn("delete the devices of a sandbox (reclaimed at the next start)", "sandbox", a.rec.ID, "err", err)
	}
	a.rec.ClearDevices()
}
