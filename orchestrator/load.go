package orchestrator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/recovery"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// load registers the persisted sandboxes after Recover: paused ones as
// they are, running ones whose VMM Recover took over re-adopted with their
// slot; anything else left (a record Recover could not settle) is dropped.
// Then directories no record owns and fork snapshots no child uses go.
func (o *Orchestrator) load(ctx context.Context) error {
	recs, err := store.ListAll[sandbox.Record](o.store, store.Sandboxes)
	if err != nil {
		return fmt.Errorf("orchestrator: load sandboxes: %w", err)
	}
	for _, r := range recs {
		if m, ok := o.cfg.Recovered.Machine(r.ID); ok && r.State == sandbox.Running {
			o.adoptRunning(ctx, r, m)
			continue
		}
		if r.State == sandbox.Paused && pausedIntact(r) {
			o.sandboxes[r.ID] = &instance{rec: r}
			o.log.Info("kept paused sandbox", "sandbox", r.ID, "filesystemOnly", r.FilesystemOnly)
			if !r.FilesystemOnly && r.Snapshot != "" {
				o.mem.FlattenInterrupted(r.ID, r.Snapshot)
			}
			continue
		}
		o.log.Error("dropping sandbox that cannot be re-adopted", "sandbox", r.ID, "state", r.State)
		if err := recovery.DropRecord(ctx, o.verbs, o.recoveryJournal(), r, nil); err != nil {
			return err
		}
	}
	o.removeUnowned()
	o.removeUnownedGroups()
	if o.memDev != nil {
		o.memDev.ReleaseUnheld(ctx, func(holder string) bool {
			for _, s := range o.sandboxes {
				if s.vm != nil && vmName(s.rec) == holder {
					return true
				}
			}
			return false
		})
	}
	o.volumes.ReleaseAbsent(func(id string) bool { _, ok := o.sandboxes[id]; return ok })
	return nil
}

// pausedIntact reports whether a paused sandbox still has what its resume
// needs: its snapshot, or for a filesystem-only pause its root disk (the
// storage daemon's image config).
func pausedIntact(r sandbox.Record) bool {
	need := []string{r.Snapshot}
	if r.FilesystemOnly {
		need = []string{r.RootfsImage}
	}
	for _, p := range need {
		if _, err := os.Stat(p); p != "" && err == nil {
			return true
		}
	}
	return false
}

// groupLister is the optional capability of listing the node's control
// groups (*cgroup.Hierarchy has it).
type groupLister interface{ List() ([]string, error) }

// removeUnownedGroups removes the control groups of VMs no running sandbox
// owns (their VMMs were killed by Recover; whatever still runs in such a
// group is killed with it).
func (o *Orchestrator) removeUnownedGroups() {
	gl, ok := o.cfg.Groups.(groupLister)
	if !ok {
		return
	}
	names, err := gl.List()
	if err != nil {
		o.log.Warn("list control groups", "err", err)
		return
	}
	owned := map[string]bool{}
	for _, s := range o.sandboxes {
		if s.vm != nil {
			// The second name is a group's from before names were digests.
			owned[sandbox.GroupName(vmName(s.rec))], owned[vmName(s.rec)] = true, true
		}
	}
	for _, name := range names {
		if owned[name] {
			continue
		}
		g, err := o.cfg.Groups.Open(name)
		if err == nil {
			err = g.Remove()
		}
		if err != nil {
			o.log.Warn("remove control group no sandbox owns", "group", name, "err", err)
			continue
		}
		o.log.Info("removed control group no sandbox owns", "group", name)
	}
}

// removeUnowned deletes sandbox and snapshot directories that no record
// names (a crash between creating one and recording it) and hidden fork
// snapshots whose children are all gone.
func (o *Orchestrator) removeUnowned() {
	owned := map[string]bool{}
	for _, s := range o.sandboxes {
		owned[filepath.Clean(s.rec.Dir)] = true
	}
	snaps, _ := store.ListAll[snapshot.Record](o.store, store.Snapshots)
	for _, r := range snaps {
		owned[filepath.Clean(r.Dir)] = true
	}
	for _, kind := range []string{"sandboxes", "snapshots"} {
		parent := filepath.Join(o.cfg.DataDir, kind)
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			dir := filepath.Join(parent, e.Name())
			if owned[dir] {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				o.log.Warn("remove a directory no record owns", "dir", dir, "err", err)
				continue
			}
			o.log.Warn("removed a directory no record owns", "dir", dir)
		}
	}
	for _, r := range snaps {
		if r.Hidden {
			o.collectForkSnapshot(r.ID)
		}
	}
}

// adoptRunning makes a recovered VM a running sandbox again: its slot is
// adopted from the network manager, the sandbox's egress policy set anew,
// its agent checked and its timeout re-armed. If any of that fails, the
// sandbox is paused (snapshot, then the VM stops) or, failing that, dropped.
func (o *Orchestrator) adoptRunning(ctx context.Context, r sandbox.Record, m vmm.Machine) {
	s := &instance{rec: r}
	slot, err := o.nets.Adopt(ctx, r.Slot)
	if err == nil {
		s.vm = sandbox.Adopt(o.vms, vmName(s.rec), m, slot, vmDisk{o, s}, o.vmDrives(s, s.rec))
		if o.memDev != nil && isDevice(r.Memory.File) {
			s.vm.HoldMemory(o.memDev.Adopted(ctx, r.Memory.File, vmName(r)))
		}
		err = func() error {
			// A crash during a snapshot leaves the vCPUs stopped.
			if err := m.Resume(ctx); err != nil {
				return fmt.Errorf("resume vCPUs: %w", err)
			}
			if !isZeroPolicy(r.Policy) {
				if err := slot.SetPolicy(ctx, r.Policy); err != nil {
					return fmt.Errorf("network policy: %w", err)
				}
			}
			o.repin(ctx, r, m, true)
			o.retarget(ctx, r, m, true)
			return sandbox.WaitAgent(ctx, slot, 20*time.Second)
		}()
	}
	if err == nil {
		s.rec.PID = m.Info().PID
		s.rec.PIDStart = vmmproc.Start(s.rec.PID)
		err = o.journal.Put(s.rec)
	}
	if err != nil {
		o.pauseUnadoptable(ctx, s, m, slot, err)
		return
	}
	o.sandboxes[r.ID] = s
	s.mu.Lock()
	o.armTimer(s)
	s.mu.Unlock()
	o.watchVM(s, s.vm)
	o.log.Info("sandbox keeps running after the restart", "sandbox", r.ID, "slot", slot.Name)
}

// pauseUnadoptable pauses a recovered VM that cannot run on (its slot or
// agent failed), or drops the sandbox if even that fails.
func (o *Orchestrator) pauseUnadoptable(ctx context.Context, s *instance, m vmm.Machine, slot *network.Slot, cause error) {
	r := s.rec
	o.log.Warn("re-adopted VM cannot run on; pausing the sandbox", "sandbox", r.ID, "err", cause)
	// The slot goes back only once the VM using its tap is stopped
	// (recovery.PauseAdopted stops it whatever happens).
	perr := recovery.PauseAdopted(ctx, o.verbs, o.recoveryJournal(), r, m)
	if slot != nil {
		_ = o.nets.Release(context.WithoutCancel(ctx), slot)
	} else {
		_ = o.nets.Forget(r.Slot)
	}
	if perr != nil {
		o.log.Error("cannot keep the re-adopted sandbox; dropping it", "sandbox", r.ID, "err", perr)
		if err := recovery.DropRecord(ctx, o.verbs, o.recoveryJournal(), r, nil); err != nil {
			o.log.Error("drop sandbox", "sandbox", r.ID, "err", err)
		}
		return
	}
	var rec sandbox.Record
	if err := o.store.Get(store.Sandboxes, r.ID, &rec); err == nil {
		o.sandboxes[r.ID] = &instance{rec: rec}
	}
}

// recoveryJournal writes the records of sandboxes the start settles
// (recovery's journal: no events, no fault points).
func (o *Orchestrator) recoveryJournal() *sandbox.Journal {
	return &sandbox.Journal{Store: o.store, Log: o.log, Recovery: true}
}
