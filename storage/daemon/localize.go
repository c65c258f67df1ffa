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
	"sync"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// A localize moves lowers a device reads from URLs onto local files with
// the same bytes, under its live export. A node serves the layers it has
// not fetched yet to this daemon over a URL (verified as they are read),
// fetches them whole in the background, and then asks for the move, so a
// device does not depend on the remote end for ever. Its steps, each
// durable before the next and followed by a failpoint:
//
//  1. check each file against the digest its URL names (sha256 of the whole
//     file): a file that differs would change the disk under the guest
//  2. write the served config again, naming the files, under a new name
//     image.GEN.NONCE.json (after-config)
//  3. save device.json naming that config, the files as layers and their
//     stamps: the commit point (after-record)
//  4. move the open image's lowers onto the files (image.SwapLower: reads
//     in flight finish on the URL), then remove the old config
//
// The upper is the same before and after: only the served config and the
// record change. Until step 3 the record names the old config and the
// URLs, which still serve the same bytes; a restarted daemon removes the
// new config (a file no record names) and reads remotely. After it, a
// restarted daemon opens the files. A file whose digest does not match is
// refused (invalid) and nothing changes.

// localize runs a localize (see above) with the device's op lock held.
func (d *Daemon) localize(ctx context.Context, p rpc.LocalizeParams) (rpc.Device, error) {
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.Device{}, err
	}
	defer dv.op.Unlock()
	switch {
	case dv.lost != "":
		return rpc.Device{}, errf(rpc.CodeLost, "device %d is lost: %s", p.ID, dv.lost)
	case dv.rec.Kind == rpc.KindShared:
		return rpc.Device{}, errf(rpc.CodeConflict, "device %d is shared: its config is the image's own", p.ID)
	}
	moves, err := d.checkMoves(ctx, dv.rec, p.Lowers)
	if err != nil {
		return rpc.Device{}, fmt.Errorf("localize device %d: %w", p.ID, err)
	}
	if len(moves) == 0 {
		return dv.info(d), nil
	}
	if err := d.localizeSteps(dv, moves); err != nil {
		return rpc.Device{}, fmt.Errorf("localize device %d: %w", p.ID, err)
	}
	d.log.Info("device lowers moved to local files", "device", p.ID, "lowers", len(moves))
	return dv.info(d), nil
}

// checkMoves keeps the pairs whose URL the device reads from and checks
// each file against the digest its URL names (step 1).
func (d *Daemon) checkMoves(ctx context.Context, r record, lowers []rpc.LocalLower) ([]rpc.LocalLower, error) {
	var out []rpc.LocalLower
	for _, l := range lowers {
		if !slices.Contains(r.Layers, l.URL) || slices.ContainsFunc(out, func(m rpc.LocalLower) bool { return m.URL == l.URL }) {
			continue
		}
		want, ok := blob.URLDigest(l.URL)
		switch {
		case !ok:
			return nil, errf(rpc.CodeInvalid, "lower %s names no sha256 digest: its copy cannot be checked", l.URL)
		case !filepath.IsAbs(l.File) || blob.IsURL(l.File):
			return nil, errf(rpc.CodeInvalid, "local copy %q of %s is not an absolute path", l.File, l.URL)
		}
		got, err := d.digests.of(ctx, l.File)
		if errors.Is(err, os.ErrNotExist) {
			return nil, errf(rpc.CodeInvalid, "local copy of %s: %v", l.URL, err)
		}
		if err != nil {
			return nil, fmt.Errorf("local copy of %s: %w", l.URL, err)
		}
		if got != want {
			return nil, errf(rpc.CodeInvalid, "local copy %s of %s is %s, not the layer's %s", l.File, l.URL, got, want)
		}
		out = append(out, l)
	}
	return out, nil
}

// localizeSteps runs steps 2-4 (op held).
func (d *Daemon) localizeSteps(dv *device, moves []rpc.LocalLower) error {
	dir := d.deviceDir(dv.rec.ID)
	next, cfg, err := localizedRecord(dv.rec, dir, moves)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(next.Config, append(b, '\n'), 0o600); err != nil {
		return err
	}
	if err := fpLocalizeAfterConfig.Inject(); err != nil {
		os.Remove(next.Config)
		return err
	}
	if err := d.save(&next); err != nil {
		// As in a restack: what is on disk says whether it committed.
		if r, lerr := loadRecord(dir); lerr != nil || r.Config != next.Config {
			os.Remove(next.Config)
			return err
		}
		d.log.Warn("localize: record saved with an error; continuing on the local files", "device", next.ID, "err", err)
	}
	fpLocalizeAfterRecord.Inject() // committed: nothing rolls back
	old := dv.rec.Config
	dv.set(func() { dv.rec = next })
	d.swapLowers(dv, moves)
	if filepath.Dir(old) == dir && old != next.Config {
		if err := errors.Join(os.Remove(old), atomicfile.SyncDir(dir)); err != nil {
			d.log.Warn("localize: remove the old config (the next start does)", "device", next.ID, "err", err)
		}
	}
	return nil
}

// localizedRecord is the record and served config after the moves: the
// same upper, the files in place of the URLs.
func localizedRecord(r record, dir string, moves []rpc.LocalLower) (record, *image.Config, error) {
	cfg, err := image.LoadConfig(r.Config)
	if err != nil {
		return record{}, nil, err
	}
	next := r
	next.Layers = slices.Clone(r.Layers)
	next.Stamps = slices.Clone(r.Stamps)
	for _, m := range moves {
		st, err := stampFile(m.File)
		if err != nil {
			return record{}, nil, err
		}
		next.Stamps = append(next.Stamps, st)
		for i, l := range next.Layers {
			if l == m.URL {
				next.Layers[i] = m.File
			}
		}
		for i, l := range cfg.Lowers {
			if l.URL == m.URL {
				cfg.Lowers[i] = image.LayerRef{File: m.File}
			}
		}
	}
	next.Config = filepath.Join(dir, fmt.Sprintf("image.%d.%s.json", r.Gen, nonce()))
	return next, cfg, nil
}

// swapLowers moves the open image's lowers onto the files (step 4). A
// failure leaves those lowers on their URLs, which serve the same bytes,
// until the next start opens the files the record names.
func (d *Daemon) swapLowers(dv *device, moves []rpc.LocalLower) {
	dv.be.mu.RLock()
	im := dv.be.im
	dv.be.mu.RUnlock()
	if im == nil {
		return
	}
	for _, m := range moves {
		b, err := blob.OpenLocal(m.File, true)
		if err == nil {
			var n int
			if n, err = im.SwapLower(m.URL, b); n == 0 {
				b.Close()
			}
		}
		if err != nil {
			d.log.Warn("localize: the export reads the URL until the next start", "device", dv.rec.ID, "url", m.URL, "err", err)
		}
	}
}

// digestMemo remembers the sha256 of files by their stamp: the devices of
// one image move onto the same copies, which are hashed once.
type digestMemo struct {
	mu   sync.Mutex
	sums map[stamp]string
}

// maxDigestMemo bounds the memo; past it, it starts over.
const maxDigestMemo = 1024

// of returns "sha256:<hex>" of the file at path.
func (m *digestMemo) of(ctx context.Context, path string) (string, error) {
	st, err := stampFile(path)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	sum, ok := m.sums[st]
	m.mu.Unlock()
	if ok {
		return sum, nil
	}
	if sum, err = hashFile(ctx, path); err != nil {
		return "", err
	}
	if after, err := stampFile(path); err != nil || after != st {
		return "", fmt.Errorf("digest %s: the file changed while it was read", path)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sums == nil || len(m.sums) >= maxDigestMemo {
		m.sums = map[stamp]string{}
	}
	m.sums[st] = sum
	return sum, nil
}

// hashFile is the sha256 of a file, read in large blocks; ctx stops it.
func hashFile(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 4<<20)
	for {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("digest %s: %w", path, err)
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
		}
		if err != nil {
			return "", fmt.Errorf("digest %s: %w", path, err)
		}
	}
}
