// Package volume keeps a node's volumes (E2B's Volume): named disks that
// outlive the sandboxes that mount them. A volume is a layered image of its
// own, like a root disk: sealed layers (the first a blank ext4 filesystem
// of the volume's size, which is its size limit) listed by an image config,
// and, while a sandbox mounts it, that sandbox's writable upper on top.
//
// One sandbox mounts a volume read-write at a time, or any number mount it
// read-only (they see its sealed layers). When the read-write holder goes
// (killed), the layers it sealed are adopted into the volume's directory
// and the volume's config lists them: the next mount sees what was
// written. The store only keeps records and layers; attaching a volume as
// a drive of a sandbox is the orchestrator's (orchestrator/volumes.go).
//
// Durability: each volume is a directory under the store's with volume.json,
// its record; every file the record names (layers, image configs) is
// complete on disk before the record is written (internal/atomicfile), and
// the record itself is replaced atomically. A volume directory without a
// record is a create a crash interrupted and is removed on Open, as are the
// files of a volume's directory its record does not name (an interrupted
// commit's or merge's).
package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/snapshot"
)

// Limits of a volume.
const (
	MinSizeMiB = 16       // room for ext4's own metadata
	MaxSizeMiB = 64 << 10 // sparse: only what is written takes space
	// DefaultSizeMiB is a volume's size when neither its create nor the
	// node's configuration names one.
	DefaultSizeMiB = 1 << 10
	maxVolumes     = 1000
	recordFile     = "volume.json"
)

// ValidName is a volume name: what E2B accepts (letters, digits, '-' and
// '_', up to 63 characters, starting with a letter or digit).
var ValidName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// Fault points between the durable steps of a volume's changes.
var (
	fpCreateDir     = failpoint.New("volume/create/dir")     // the volume's directory entry is durable, empty
	fpCreateLayer   = failpoint.New("volume/create/layer")   // base layer and config written, no record yet
	fpCommitLinks   = failpoint.New("volume/commit/adopted") // a holder's layers linked in, record not yet
	fpCompactMerged = failpoint.New("volume/compact/merged") // merged layer and its config written, record not yet
)

// Volume is a volume's record.
type Volume struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	SizeMiB   int       `json:"sizeMiB"`
	CreatedAt time.Time `json:"createdAt"`
	// Config is the image config listing the volume's sealed layers.
	Config string `json:"config"`
	// Gen counts the commits; it names the next config.
	Gen int `json:"gen"`
	// Writer is the sandbox that mounts the volume read-write; Readers
	// those that mount it read-only.
	Writer  string   `json:"writer,omitempty"`
	Readers []string `json:"readers,omitempty"`
}

// InUse reports whether a sandbox mounts v.
func (v Volume) InUse() bool { return v.Writer != "" || len(v.Readers) > 0 }

// Holders lists the sandboxes that mount v.
func (v Volume) Holders() []string {
	out := slices.Clone(v.Readers)
	if v.Writer != "" {
		out = append(out, v.Writer)
	}
	return out
}

// Formatter writes a blank filesystem of size bytes as a sealed layer at
// base+".lsmt" and its image config at base+".json" (layers.go).
type Formatter func(ctx context.Context, base string, size int64) error

// Options configure a Store.
type Options struct {
	// DefaultSizeMiB is the size of a volume whose create names none
	// (E2B's SDK never does); zero: DefaultSizeMiB.
	DefaultSizeMiB int
	// Format writes a blank volume's layer; nil: FormatExt4.
	Format Formatter
	Logger *slog.Logger
}

// Store is a node's volumes.
type Store struct {
	dir         string
	format      Formatter
	defaultSize int
	log         *slog.Logger

	mu   sync.Mutex
	vols map[string]*Volume // by id
}

// Open loads the volumes kept under dir (created if missing).
func Open(dir string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Format == nil {
		opts.Format = FormatExt4
	}
	if opts.DefaultSizeMiB == 0 {
		opts.DefaultSizeMiB = DefaultSizeMiB
	}
	if opts.DefaultSizeMiB < MinSizeMiB || opts.DefaultSizeMiB > MaxSizeMiB {
		return nil, fmt.Errorf("open volumes %s: default size %d MiB out of range %d..%d", dir, opts.DefaultSizeMiB, MinSizeMiB, MaxSizeMiB)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open volumes %s: %w", dir, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("open volumes %s: %w", dir, err)
	}
	s := &Store{dir: dir, format: opts.Format, defaultSize: opts.DefaultSizeMiB, log: log, vols: map[string]*Volume{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open volumes %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		vdir := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(filepath.Join(vdir, recordFile))
		if errors.Is(err, os.ErrNotExist) {
			log.Info("remove volume directory without a record (an interrupted create)", "dir", vdir)
			_ = os.RemoveAll(vdir)
			continue
		}
		var v Volume
		if err == nil {
			err = json.Unmarshal(b, &v)
		}
		if err != nil || v.ID != e.Name() {
			return nil, fmt.Errorf("open volume %s: bad record: %v", vdir, err)
		}
		s.vols[v.ID] = &v
		s.removeUnnamed(v)
	}
	return s, nil
}

// removeUnnamed removes the files of v's directory its record does not
// name, directly or through its config: what a commit or a merge a crash
// interrupted left.
func (s *Store) removeUnnamed(v Volume) {
	vdir := filepath.Join(s.dir, v.ID)
	layers, err := snapshot.LayersOf(v.Config)
	if err != nil {
		s.log.Warn("volume config unreadable; its directory is left as it is", "volume", v.ID, "err", err)
		return
	}
	keep := map[string]bool{recordFile: true, filepath.Base(v.Config): true}
	for _, l := range layers {
		if filepath.Dir(l) == vdir {
			keep[filepath.Base(l)] = true
		}
	}
	entries, _ := os.ReadDir(vdir)
	for _, e := range entries {
		if !keep[e.Name()] {
			s.log.Info("remove a volume file no record names", "volume", v.ID, "file", e.Name())
			_ = os.RemoveAll(filepath.Join(vdir, e.Name()))
		}
	}
}

// Create makes a blank volume named name of sizeMiB (0: the store's
// default).
func (s *Store) Create(ctx context.Context, name string, sizeMiB int) (Volume, error) {
	if !ValidName.MatchString(name) {
		return Volume{}, fmt.Errorf("create volume %q: a name is 1 to 63 letters, digits, '-' or '_', starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	if sizeMiB == 0 {
		sizeMiB = s.defaultSize
	}
	if sizeMiB < MinSizeMiB || sizeMiB > MaxSizeMiB {
		return Volume{}, fmt.Errorf("create volume %q: size %d MiB out of range %d..%d: %w", name, sizeMiB, MinSizeMiB, MaxSizeMiB, errdefs.ErrInvalid)
	}
	id, err := ids.New()
	if err != nil {
		return Volume{}, fmt.Errorf("create volume %q: %w", name, err)
	}
	v := Volume{ID: id, Name: name, SizeMiB: sizeMiB, CreatedAt: time.Now().UTC()}
	// The name is claimed under the lock by a record without a config; the
	// format (seconds for a large volume) runs outside it.
	s.mu.Lock()
	if len(s.vols) >= maxVolumes {
		s.mu.Unlock()
		return Volume{}, fmt.Errorf("create volume %q: the node holds %d volumes, the most it keeps: %w", name, len(s.vols), errdefs.ErrCapacity)
	}
	if _, err := s.byName(name); err == nil {
		s.mu.Unlock()
		return Volume{}, fmt.Errorf("create volume %q: the name is taken: %w", name, errdefs.ErrConflict)
	}
	s.vols[id] = &v
	s.mu.Unlock()
	v, err = s.makeVolume(ctx, v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.vols, id)
		_ = os.RemoveAll(filepath.Join(s.dir, id))
		return Volume{}, fmt.Errorf("create volume %q: %w", name, err)
	}
	*s.vols[id] = v
	return v, nil
}

// makeVolume writes v's directory: the blank base layer, its config and,
// last, the record.
func (s *Store) makeVolume(ctx context.Context, v Volume) (Volume, error) {
	vdir := filepath.Join(s.dir, v.ID)
	if err := os.Mkdir(vdir, 0o700); err != nil {
		return v, err
	}
	// The record below is fsynced in vdir; vdir's own entry in the store's
	// directory must be durable first, or a power loss loses the volume
	// its record called created.
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return v, err
	}
	if err := fpCreateDir.Inject(); err != nil {
		return v, err
	}
	base := filepath.Join(vdir, "base")
	if err := s.format(ctx, base, int64(v.SizeMiB)<<20); err != nil {
		return v, err
	}
	v.Config = base + ".json"
	if err := fpCreateLayer.Inject(); err != nil {
		return v, err
	}
	return v, s.persist(v)
}

// persist writes v's record.
func (s *Store) persist(v Volume) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, v.ID, recordFile), b, 0o600); err != nil {
		return fmt.Errorf("record volume %s: %w", v.ID, err)
	}
	return nil
}

// List returns the volumes (those being created too), oldest first.
func (s *Store) List() []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Volume, 0, len(s.vols))
	for _, v := range s.vols {
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b Volume) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmpString(a.ID, b.ID)
	})
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Get returns the volume of id or name.
func (s *Store) Get(ref string) (Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.lookup(ref)
	if err != nil {
		return Volume{}, err
	}
	return *v, nil
}

// lookup (mu held) finds a ready volume by id, then by name.
func (s *Store) lookup(ref string) (*Volume, error) {
	if v, ok := s.vols[ref]; ok && v.Config != "" {
		return v, nil
	}
	v, err := s.byName(ref)
	if err != nil || v.Config == "" {
		return nil, fmt.Errorf("volume %q: %w", ref, errdefs.ErrNotFound)
	}
	return v, nil
}

// byName (mu held) finds a volume by name.
func (s *Store) byName(name string) (*Volume, error) {
	for _, v := range s.vols {
		if v.Name == name {
			return v, nil
		}
	}
	return nil, fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
}

// Delete removes the volume of id or name; 409 while a sandbox mounts it.
func (s *Store) Delete(ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.lookup(ref)
	if err != nil {
		return fmt.Errorf("delete %w", err)
	}
	if v.InUse() {
		return fmt.Errorf("delete volume %s: mounted by sandbox %v: %w", v.Name, v.Holders(), errdefs.ErrConflict)
	}
	// The record goes first: a crash after it leaves a directory Open
	// removes, never a record pointing at missing layers.
	vdir := filepath.Join(s.dir, v.ID)
	if err := os.Remove(filepath.Join(vdir, recordFile)); err != nil {
		return fmt.Errorf("delete volume %s: %w", v.Name, err)
	}
	_ = atomicfile.SyncDir(vdir)
	delete(s.vols, v.ID)
	if err := os.RemoveAll(vdir); err != nil {
		s.log.Warn("remove volume directory (the next start removes it)", "volume", v.ID, "err", err)
	}
	return nil
}
