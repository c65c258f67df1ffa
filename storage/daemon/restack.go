package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// A restack seals a device's live upper into a new layer and continues the
// device on a fresh upper stacked on it. Its steps, each durable before the
// next starts, and each followed by a failpoint:
//
//  1. journal STATE/devices/ID/restack.json = {step: begun, from, gen, layer, config} (after-intent)
//  2. quiesce I/O, flush the upper, write the sealed layer (temp, fsync,
//     rename) and fsync its directory (after-seal); journal step "sealed"
//  3. write the next generation: fresh upper files fsynced, then
//     image.GEN.json atomically (after-config); journal step "configured"
//  4. save device.json naming the new config, layers and stamps: the commit
//     point (after-record)
//  5. swap the served image; remove the old generation's config and upper,
//     fsync the directory (after-cleanup)
//  6. remove the journal
//
// Until step 4 the record names the old generation, whose upper still holds
// every write (sealing reads the upper, it never changes it), so a restarted
// daemon that finds a journal whose generation the record does not name
// rolls back: it removes the new config, uppers and the sealed layer. Once
// the record names the journal's generation it rolls forward: it removes the
// old generation. Either way the journal goes last.
//
// A seal that keeps the upper (rpc.RestackParams.Keep, sealKeeping) runs
// step 2 alone, to a path the caller names: nothing the daemon records
// changes, so it needs no journal, and a crash leaves at most that file
// (storaged/seal/after-layer).

const journalName = "restack.json"

// Journal steps.
const (
	stepBegun      = "begun"
	stepSealed     = "sealed"
	stepConfigured = "configured"
)

// restackJournal is the intent record of one restack.
type restackJournal struct {
	Step    string    `json:"step"`
	From    int       `json:"from"` // generation the record names before the restack
	Gen     int       `json:"gen"`  // generation it creates
	Layer   string    `json:"layer"`
	Config  string    `json:"config"`
	Started time.Time `json:"started"`
}

func writeJournal(dir string, j *restackJournal) error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, journalName), b, 0o600)
}

func loadJournal(dir string) (*restackJournal, error) {
	b, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		return nil, err
	}
	var j restackJournal
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("decode %s: %w", journalName, err)
	}
	return &j, nil
}

func removeJournal(dir string) error {
	if err := os.Remove(filepath.Join(dir, journalName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(dir)
}

// rollBack undoes an uncommitted restack: the record still names j.From.
// It never removes a file a device record names (a lower of this or another
// device): the journal is trusted no further than that.
func rollBack(dir string, j *restackJournal, named func(path string) bool) error {
	errs := []error{removeGeneration(dir, j.Gen)}
	for _, p := range []string{j.Layer, j.Layer + ".tmp"} {
		if named(p) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, atomicfile.SyncDir(filepath.Dir(j.Layer)), removeJournal(dir))
	return errors.Join(errs...)
}

// finishRestack completes a committed restack: the record names j.Gen.
func finishRestack(dir string, j *restackJournal) error {
	return errors.Join(removeGeneration(dir, j.From), removeJournal(dir))
}

// recoverRestack finishes or rolls back the restack a journal in dir
// describes, and says which (for the log), or "" without a journal. named
// says whether a device record names a file (rollBack keeps those).
func recoverRestack(dir string, r *record, named func(path string) bool) (string, error) {
	j, err := loadJournal(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", err
	case r.Gen == j.Gen && r.Config == j.Config:
		return "finished", finishRestack(dir, j)
	case r.Gen == j.From:
		return "rolled back from step " + j.Step, rollBack(dir, j, named)
	default:
		return "", fmt.Errorf("restack journal for generation %d→%d, record at %d", j.From, j.Gen, r.Gen)
	}
}

func (d *Daemon) restackLayerPath(dir string, gen int, want string) (string, error) {
	layer := filepath.Clean(want)
	switch {
	case want == "":
		layer = filepath.Join(dir, "layers", fmt.Sprintf("layer-%d.lsmt", gen))
	case !filepath.IsAbs(want):
		// Relative to what? The daemon's working directory means nothing to a client.
		return "", errf(rpc.CodeInvalid, "layer path %q is not absolute", want)
	}
	// Never overwrite a file: it may be a lower of this or another device
	// (a retried restack whose first answer was lost).
	if _, err := os.Lstat(layer); err == nil {
		return "", errf(rpc.CodeConflict, "layer %s already exists", layer)
	}
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return "", fmt.Errorf("layer directory: %w", err)
	}
	return layer, nil
}

func (d *Daemon) restack(ctx context.Context, p rpc.RestackParams) (rpc.RestackResult, error) {
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	defer dv.op.Unlock()
	switch {
	case dv.lost != "":
		return rpc.RestackResult{}, errf(rpc.CodeLost, "device %d is lost: %s", p.ID, dv.lost)
	case dv.rec.Kind != rpc.KindRuntime || dv.rec.ReadOnly:
		return rpc.RestackResult{}, errf(rpc.CodeConflict, "device %d is %s/read-only=%v: only writable runtime devices restack", p.ID, dv.rec.Kind, dv.rec.ReadOnly)
	case p.Keep && p.Layer == "":
		// The generation names the default path, and a kept device stays on its own.
		return rpc.RestackResult{}, errf(rpc.CodeInvalid, "seal device %d keeping its upper: the layer path is required", p.ID)
	}
	dir := d.deviceDir(p.ID)
	gen := dv.rec.Gen + 1
	layer, err := d.restackLayerPath(dir, gen, p.Layer)
	if err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}
	if p.Keep {
		return d.sealKeeping(ctx, dv, layer, p.Message)
	}
	j := &restackJournal{Step: stepBegun, From: dv.rec.Gen, Gen: gen, Layer: layer, Config: genConfig(dir, gen), Started: time.Now().UTC()}
	t := newStopwatch()
	res, err := d.restackSteps(ctx, dv, j, p.Message, t)
	if err != nil {
		if rerr := rollBack(dir, j, d.namedNow); rerr != nil {
			d.log.Error("restack: roll back", "device", p.ID, "err", rerr)
		}
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}
	d.log.Info("device restacked", append([]any{"device", p.ID, "gen", gen, "layer", layer, "digest", res.Digest}, t.attrs()...)...)
	return res, nil
}

// restackSteps runs steps 1-6 (see above) with the device's op lock held,
// timing them on t.
// An error before the record is saved leaves the caller to roll back.
func (d *Daemon) restackSteps(ctx context.Context, dv *device, j *restackJournal, msg string, t *stopwatch) (rpc.RestackResult, error) {
	dir := d.deviceDir(dv.rec.ID)
	step := func(name string, fp point) error {
		if err := fp.Inject(); err != nil {
			return err
		}
		if name == "" {
			return nil
		}
		j.Step = name
		return writeJournal(dir, j)
	}
	if err := writeJournal(dir, j); err != nil {
		return rpc.RestackResult{}, err
	}
	if err := step("", fpRestackAfterIntent); err != nil {
		return rpc.RestackResult{}, err
	}
	be := dv.be
	be.mu.Lock() // quiesce: in-flight requests drain, new ones wait
	defer be.mu.Unlock()
	t.lap("quiesce")
	info, err := sealUpper(ctx, be.im, j.Layer, dir, msg)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("seal")
	if err := step(stepSealed, fpRestackAfterSeal); err != nil {
		return rpc.RestackResult{}, err
	}
	digest, err := fileDigest(j.Layer)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("digest")
	next, err := nextRecord(dv.rec, j)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	if _, err := writeGeneration(ctx, dir, j.Gen, next.Layers, dv.rec.Size, false); err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("generation")
	if err := step(stepConfigured, fpRestackAfterConfig); err != nil {
		return rpc.RestackResult{}, err
	}
	newIm, err := image.Open(ctx, next.Config, d.imageOptions(false))
	if err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("open")
	if err := d.save(&next); err != nil {
		// The rename may have landed before the failure (a failed directory
		// fsync): what is on disk decides whether the restack committed.
		if r, lerr := loadRecord(dir); lerr != nil || r.Gen != j.Gen {
			newIm.Close()
			return rpc.RestackResult{}, err
		}
		d.log.Warn("restack: record saved with an error; continuing on the new generation", "device", next.ID, "err", err)
	}
	// Committed: from here on nothing rolls back.
	fpRestackAfterRecord.Inject()
	oldIm, oldConfig := be.im, dv.rec.Config
	be.im = newIm
	dv.set(func() { dv.rec = next })
	if err := oldIm.Close(); err != nil {
		d.log.Warn("restack: close old image", "device", next.ID, "err", err)
	}
	// The old generation's config may be one a localize wrote.
	if err := removeGeneration(dir, j.From, oldConfig); err != nil {
		d.log.Warn("restack: remove old generation (the next start retries)", "device", next.ID, "err", err)
	} else if fpRestackAfterCleanup.Inject() == nil {
		if err := removeJournal(dir); err != nil {
			d.log.Warn("restack: remove journal", "device", next.ID, "err", err)
		}
	}
	t.lap("cleanup")
	return rpc.RestackResult{Layer: j.Layer, Digest: digest, Size: info.Size, Layers: next.Layers, Device: dv.info(d)}, nil
}

// sealKeeping writes the device's upper as a sealed layer at path and
// leaves the device as it is (rpc.RestackParams.Keep), with its op lock
// held. No record changes, so there is no journal: a crash leaves at most
// a layer file no record names, which the caller chose the path of (a
// failed seal removes it).
func (d *Daemon) sealKeeping(ctx context.Context, dv *device, path, msg string) (rpc.RestackResult, error) {
	t := newStopwatch()
	res, err := d.sealCopy(ctx, dv, path, msg, t)
	if err != nil {
		for _, p := range []string{path, path + ".tmp"} {
			_ = os.Remove(p)
		}
		return rpc.RestackResult{}, fmt.Errorf("seal device %d: %w", dv.rec.ID, err)
	}
	d.log.Info("device sealed, upper kept", append([]any{"device", dv.rec.ID, "layer", path, "digest", res.Digest}, t.attrs()...)...)
	return res, nil
}

func (d *Daemon) sealCopy(ctx context.Context, dv *device, path, msg string, t *stopwatch) (rpc.RestackResult, error) {
	be := dv.be
	be.mu.Lock() // quiesce: the layer is the upper as of one instant
	info, err := sealUpper(ctx, be.im, path, d.deviceDir(dv.rec.ID), msg)
	be.mu.Unlock()
	if err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("seal")
	digest, err := fileDigest(path)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	t.lap("digest")
	if err := fpSealAfterLayer.Inject(); err != nil {
		return rpc.RestackResult{}, err
	}
	return rpc.RestackResult{Layer: path, Digest: digest, Size: info.Size, Layers: append(slices.Clone(dv.rec.Layers), path), Device: dv.info(d)}, nil
}

// sealUpper flushes the image's upper and writes it as a sealed layer at
// path, durable (file and directory entry) when it returns.
func sealUpper(ctx context.Context, im *image.Image, path, stateDir, msg string) (image.LayerInfo, error) {
	if err := im.Flush(); err != nil {
		return image.LayerInfo{}, fmt.Errorf("flush: %w", err)
	}
	info, err := im.Commit(ctx, path, image.CommitOptions{Message: msg})
	if err != nil {
		return image.LayerInfo{}, err
	}
	if strings.HasPrefix(path, stateDir+string(filepath.Separator)) {
		if err := os.Chmod(path, 0o600); err != nil {
			return image.LayerInfo{}, err
		}
	}
	// Commit fsyncs the file and renames it, but not the directory.
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return image.LayerInfo{}, fmt.Errorf("seal %s: %w", path, err)
	}
	return info, nil
}

// nextRecord is the record of generation j.Gen: old layers + the sealed one.
func nextRecord(old record, j *restackJournal) (record, error) {
	st, err := stampFile(j.Layer)
	if err != nil {
		return record{}, err
	}
	next := old
	next.Gen = j.Gen
	next.Config = j.Config
	next.Layers = append(slices.Clone(old.Layers), j.Layer)
	next.Stamps = append(slices.Clone(old.Stamps), st)
	return next, nil
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("digest %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// stopwatch times the steps of one operation for its log line.
type stopwatch struct {
	last  time.Time
	steps []any
}

func newStopwatch() *stopwatch { return &stopwatch{last: time.Now()} }

// lap ends the step named name.
func (s *stopwatch) lap(name string) {
	now := time.Now()
	s.steps = append(s.steps, name, now.Sub(s.last).Round(10*time.Microsecond))
	s.last = now
}

func (s *stopwatch) attrs() []any { return s.steps }
