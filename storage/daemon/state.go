package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/image"
)

// record is what the state directory keeps about a device
// (STATE/devices/ID/device.json). Everything needed to re-export the device
// after a restart is here or in files it names.
type record struct {
	ID       uint32    `json:"id"`
	Kind     string    `json:"kind"`
	Owner    string    `json:"owner,omitempty"`
	Image    string    `json:"image"`  // source image config (absolute)
	Config   string    `json:"config"` // config the export serves (absolute)
	ReadOnly bool      `json:"read_only"`
	Size     int64     `json:"size"`
	ReqSize  int64     `json:"req_size,omitempty"` // size as requested (0: the image's); the warm-pool shape
	TCP      bool      `json:"tcp,omitempty"`
	Kernel   bool      `json:"kernel,omitempty"`
	Export   string    `json:"export"` // NBD export name: aenv-ID-NONCE
	Holders  []string  `json:"holders,omitempty"`
	Layers   []string  `json:"layers"` // sealed layers under the upper, bottom first
	Stamps   []stamp   `json:"stamps"` // files that must not change under the export
	Gen      int       `json:"gen"`    // bumps on every restack
	Created  time.Time `json:"created"`
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

// save writes the record atomically.
func (d *Daemon) save(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("save device %d: %w", r.ID, err)
	}
	path := filepath.Join(d.deviceDir(r.ID), "device.json")
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save device %d: %w", r.ID, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("save device %d: %w", r.ID, err)
	}
	return syncDir(d.deviceDir(r.ID))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
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
