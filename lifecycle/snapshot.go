package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
)

// The snapshot's fault points (orchestrator/snapshot/stored is the
// orchestrator's, once it stored the record).
var (
	fpSnapshotSealed   = failpoint.New("orchestrator/snapshot/sealed")   // the disk is restacked, vCPUs stopped
	fpSnapshotRecorded = failpoint.New("orchestrator/snapshot/recorded") // the sandbox's new layer list is durable
)

// MemoryCapture writes a running VM's memory and state into a snapshot's
// VM directory (memimage.Images.Capture).
type MemoryCapture func(ctx context.Context, s Sandbox, vmDir, diff string) error

// Snapshot captures the sandbox (running or paused with memory) into a
// new snapshot directory under DataDir/snapshots, in stages:
//
//	settle    the memory and disks' layers are local files (a snapshot
//	          holds them)
//	dir       the snapshot's directory (undo: it goes)
//	capture   running: the vCPUs stop (undo: they continue, whatever
//	          happens), memory and VM state are written (memory), the
//	          disks are sealed and their new layer lists recorded before
//	          the VM continues, then the disks as of now are copied in;
//	          paused: the pause's snapshot and disks are linked in
//	sync      everything in the directory is durable
//
// The caller stores the record. On error nothing is left behind and a
// running sandbox keeps running.
func (v *Verbs) Snapshot(ctx context.Context, s Sandbox, hidden bool, memory MemoryCapture) (r snapshot.Record, err error) {
	done, _ := v.observe(s, "snapshot")
	defer func() { done(err) }()
	id, err := ids.New()
	if err != nil {
		return r, err
	}
	if s.Record().State == sandbox.Running {
		if err := v.localMemory(ctx, s); err != nil {
			return r, fmt.Errorf("snapshot: %w", err)
		}
	}
	rec := s.Record()
	if err := v.settle(ctx, rec); err != nil {
		return r, fmt.Errorf("snapshot sandbox %s: %w", rec.ID, err)
	}
	r = snapshot.Record{ID: id, Names: []string{}, SandboxID: rec.ID, TemplateID: rec.TemplateID, CreatedAt: time.Now().UTC(),
		Dir: filepath.Join(v.DataDir, "snapshots", id), VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB,
		MemoryTargetMiB: rec.MemoryTargetMiB, DiskMiB: rec.DiskMiB, EnvdVersion: rec.EnvdVersion, GuestToken: rec.GuestToken, Hidden: hidden,
		DriveSlots: rec.DriveSlots}
	r.VM = filepath.Join(r.Dir, "vm")
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return r, fmt.Errorf("snapshot sandbox %s: %w", rec.ID, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(r.Dir)
		}
	}()
	switch rec.State {
	case sandbox.Running:
		err = v.captureRunning(ctx, s, &r, memory)
	case sandbox.Paused:
		if rec.FilesystemOnly {
			err = fmt.Errorf("it is paused without memory (a filesystem-only pause has no VM state to snapshot); resume it first: %w", errdefs.ErrConflict)
			break
		}
		err = v.capturePaused(rec, &r)
	default:
		err = fmt.Errorf("it is %s: %w", rec.State, errdefs.ErrConflict)
	}
	if err == nil {
		err = atomicfile.SyncTree(r.Dir)
	}
	if err != nil {
		return r, fmt.Errorf("snapshot sandbox %s: %w", rec.ID, err)
	}
	return r, nil
}

// captureRunning pauses the VM, writes its snapshot and seals its disk
// into r, then resumes it whatever happened.
func (v *Verbs) captureRunning(ctx context.Context, s Sandbox, r *snapshot.Record, memory MemoryCapture) (err error) {
	vm := s.Machine()
	if err := vm.Pause(ctx); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	defer func() {
		if rerr := vm.Resume(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume: %w", rerr))
		}
	}()
	if err := memory(ctx, s, r.VM, filepath.Join(r.Dir, "mem.lsmt")); err != nil {
		return err
	}
	if err := snapshot.AdoptMemory(r.VM, s.Record().Dir, r.Dir); err != nil {
		return err
	}
	return v.captureDisk(ctx, s, r)
}

// captureDisk (VM paused) makes r's rootfs: the disk is sealed (the live
// upper becomes a layer the sandbox's disk then stacks on) and the
// sandbox's new layer list is recorded before the VM continues (or a
// crash would leave a record whose disk lacks the layer); then the disk
// as of now goes into r's directory.
func (v *Verbs) captureDisk(ctx context.Context, s Sandbox, r *snapshot.Record) error {
	rec := s.Record()
	own, err := v.Disks.SealRoot(ctx, disk.HeldOf(rec), rec.RootfsImage, fmt.Sprintf("rootfs-%d-%s", rec.Gen, r.ID), "snapshot "+r.ID, disk.RestackUpper)
	if err != nil {
		return fmt.Errorf("seal rootfs: %w", err)
	}
	var drives []sandbox.AttachedDrive
	if len(rec.Drives) > 0 {
		if drives, err = v.Disks.SealDrives(ctx, rec, fmt.Sprintf("%d-%s", rec.Gen, r.ID), "snapshot "+r.ID, disk.RestackUpper); err != nil {
			return fmt.Errorf("seal drives: %w", err)
		}
	}
	if err := fpSnapshotSealed.Inject(); err != nil {
		return err
	}
	if own != "" || len(drives) > 0 {
		err := s.Update(func(rec *sandbox.Record) {
			if own != "" {
				rec.RootfsImage = own
			}
			for i := range drives {
				rec.Drives[i].Config = drives[i].Config
			}
		})
		if err != nil {
			return err
		}
	}
	if err := fpSnapshotRecorded.Inject(); err != nil {
		return err
	}
	return v.copyDisksInto(s.Record(), r)
}

// copyDisksInto puts rec's root disk and drives, as they are now, into
// snapshot r (shared layers hard-linked).
func (v *Verbs) copyDisksInto(rec sandbox.Record, r *snapshot.Record) error {
	cfg, err := v.Disks.CopyInto(rec.RootfsImage, rec.Dir, r.Dir)
	if err != nil {
		return err
	}
	r.RootfsImage = cfg
	drives, err := disk.CopyDrivesInto(rec, r.Dir)
	r.Drives = drives
	return err
}

// capturePaused copies a paused sandbox's saved state into r.
func (v *Verbs) capturePaused(rec sandbox.Record, r *snapshot.Record) error {
	if err := snapshot.LinkTree(rec.Snapshot, r.VM); err != nil {
		return err
	}
	if err := snapshot.AdoptMemory(r.VM, rec.Dir, r.Dir); err != nil {
		return err
	}
	return v.copyDisksInto(rec, r)
}
