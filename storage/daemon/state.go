package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/lsmt"
)

// record is what the state directory keeps about a device
// (STATE/devices/ID/device.json). Everything needed to re-export the device
// after a restart is here or in files it names.
type record struct {
	ID       uint32  `json:"id"`
	Kind     string  `json:"kind"`
	Owner    string  `json:"owner,omitempty"`
	Image    string  `json:"image"`  // source image config (absolute)
	Config   string  `json:"config"` // config the export serves (absolute)
	ReadOnly bool    `json:"read_only"`
	Size     int64   `json:"size"`
	ReqSize  int64   `json:"req_size,omitempty"` // size as requested (0: the image's); the warm-pool shape
	TCP      bool    `json:"tcp,omitempty"`
	Kernel   bool    `json:"kernel,omitempty"`  // kernel NBD, from records older than Block
	Block    string  `json:"block,omitempty"`   // kernel block device kind (rpc.BlockNBD, rpc.BlockUblk)
	UblkID   *uint32 `json:"ublk_id,omitempty"` // the ublk device serving it, for recovery after a crash
	Export   string  `json:"export"`            // NBD export name: aenv-ID-NONCE
	// ConnectAs owns the export socket (rpc.CreateParams.ConnectAs).
	ConnectAs *rpc.Identity `json:"connect_as,omitempty"`
	Holders   []string      `json:"holders,omitempty"`
	Layers    []string      `json:"layers"` // sealed layers under the upper, bottom first
	Stamps    []stamp       `json:"stamps"` // files that must not change under the export
	Gen       int           `json:"gen"`    // bumps on every restack
	Created   time.Time     `json:"created"`
}

// stamp fingerprints a file the export depends on. A restarted daemon
// refuses to serve a device whose stamped files changed: the guest's page
// cache and file system would no longer match the disk.
type stamp struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_ns"`
}

func stampFile(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, fmt.Errorf("stamp %s: %w", path, err)
	}
	return stamp{Path: path, Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}, nil
}

// stampFiles stamps every local file among paths (URLs are content-addressed
// and not stamped).
func stampFiles(paths ...string) ([]stamp, error) {
	var out []stamp
	for _, p := range paths {
		if blob.IsURL(p) {
			continue
		}
		s, err := stampFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// checkStamps returns why the stamped files no longer match, or "".
func checkStamps(stamps []stamp) string {
	for _, s := range stamps {
		now, err := stampFile(s.Path)
		switch {
		case err != nil:
			return fmt.Sprintf("%s is gone: %v", s.Path, err)
		case now != s:
			return fmt.Sprintf("%s changed since it was exported (size %d→%d, mtime %d→%d)", s.Path, s.Size, now.Size, s.ModTime, now.ModTime)
		}
	}
	return ""
}

// resolveLowers returns the lowers of the image config at path as absolute
// file paths or URLs. Runtime devices stack only on sealed layers.
func resolveLowers(path string) ([]string, error) {
	cfg, err := image.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	if cfg.Upper != nil {
		return nil, fmt.Errorf("image config %s has a writable upper; devices stack on sealed layers only", path)
	}
	out := make([]string, 0, len(cfg.Lowers))
	for _, l := range cfg.Lowers {
		switch {
		case l.URL != "":
			out = append(out, l.URL)
		case filepath.IsAbs(l.File):
			out = append(out, l.File)
		default:
			out = append(out, filepath.Join(filepath.Dir(path), l.File))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("image config %s has no layers", path)
	}
	return out, nil
}

func (d *Daemon) devicesDir() string { return filepath.Join(d.opts.StateDir, "devices") }
func (d *Daemon) deviceDir(id uint32) string {
	return filepath.Join(d.devicesDir(), strconv.Itoa(int(id)))
}
func (d *Daemon) socketPath(id uint32) string {
	return filepath.Join(d.opts.RunDir, fmt.Sprintf("nbd-%d.sock", id))
}

// save writes the record atomically and durably (the commit point of every
// transition of a device).
func (d *Daemon) save(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("save device %d: %w", r.ID, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(d.deviceDir(r.ID), "device.json"), b, 0o600); err != nil {
		return fmt.Errorf("save device %d: %w", r.ID, err)
	}
	return nil
}

func genConfig(dir string, gen int) string {
	return filepath.Join(dir, fmt.Sprintf("image.%d.json", gen))
}
func genUpper(gen int) (data, index string) {
	return fmt.Sprintf("upper.%d.data", gen), fmt.Sprintf("upper.%d.index", gen)
}

// writeGeneration makes generation gen of a device in dir: a fresh upper
// (upper.GEN.data/index, fsynced) on lowers and then its config
// image.GEN.json, written atomically, so the config never names an upper
// that is not on disk. noUpper makes a read-only config.
func writeGeneration(ctx context.Context, dir string, gen int, lowers []string, size int64, noUpper bool) (string, error) {
	config := genConfig(dir, gen)
	// image.Create saves its config without fsync; it writes a scratch copy
	// and the durable config is written here.
	scratch := filepath.Join(dir, fmt.Sprintf(".image.%d.json.new", gen))
	data, index := genUpper(gen)
	cfg, err := image.Create(ctx, scratch, image.CreateSpec{Lowers: lowers, Size: size, UpperData: data, UpperIndex: index, NoUpper: noUpper})
	os.Remove(scratch)
	if err != nil {
		return "", fmt.Errorf("generation %d: %w", gen, err)
	}
	if cfg.Upper != nil {
		for _, f := range []string{cfg.Upper.Data, cfg.Upper.Index} {
			p := filepath.Join(dir, f)
			if err := os.Chmod(p, 0o600); err != nil {
				return "", fmt.Errorf("generation %d: %w", gen, err)
			}
			if err := atomicfile.SyncFile(p); err != nil {
				return "", fmt.Errorf("generation %d: %w", gen, err)
			}
		}
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", fmt.Errorf("generation %d: %w", gen, err)
	}
	if err := atomicfile.WriteFile(config, append(b, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("generation %d: %w", gen, err)
	}
	return config, nil
}

// removeGeneration deletes the config and upper files of generation gen
// (and the other configs of it named in also, those in dir) and syncs the
// directory.
func removeGeneration(dir string, gen int, also ...string) error {
	data, index := genUpper(gen)
	var errs []error
	paths := []string{genConfig(dir, gen), filepath.Join(dir, data), filepath.Join(dir, index), lsmt.JournalPath(filepath.Join(dir, index))}
	for _, p := range also {
		if filepath.Dir(p) == dir {
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, atomicfile.SyncDir(dir))
	return errors.Join(errs...)
}

func loadRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, "device.json"))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode %s/device.json: %w", dir, err)
	}
	return &r, nil
}

// scanState returns the device directories found at startup: records that
// load, and ids whose record is unreadable (reported lost).
func (d *Daemon) scanState() (recs []*record, broken map[uint32]string, err error) {
	entries, err := os.ReadDir(d.devicesDir())
	if err != nil {
		return nil, nil, fmt.Errorf("scan state %s: %w", d.devicesDir(), err)
	}
	broken = make(map[uint32]string)
	for _, e := range entries {
		id, perr := strconv.ParseUint(e.Name(), 10, 32)
		if !e.IsDir() || perr != nil {
			continue
		}
		dir := filepath.Join(d.devicesDir(), e.Name())
		r, lerr := loadRecord(dir)
		switch {
		case errors.Is(lerr, os.ErrNotExist):
			// A create that died before its record was written: nothing
			// was ever exported from it, so it is garbage.
			os.RemoveAll(dir)
		case lerr != nil:
			broken[uint32(id)] = lerr.Error()
		case r.ID != uint32(id):
			broken[uint32(id)] = fmt.Sprintf("record says id %d", r.ID)
		default:
			recs = append(recs, r)
		}
	}
	return recs, broken, nil
}

// blockKind is the record's kernel block device kind, reading the Kernel
// flag of older records as kernel NBD.
func (r *record) blockKind() string {
	if r.Block == "" && r.Kernel {
		return rpc.BlockNBD
	}
	return r.Block
}
