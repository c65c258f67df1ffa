package volume

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/snapshot"
)

// Acquire records that sandbox mounts the volume of id or name (read-only
// or read-write) and returns the volume: one writer, or any number of
// readers, never both (409 otherwise).
func (s *Store) Acquire(ref, sandbox string, readOnly bool) (Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.lookup(ref)
	if err != nil {
		return Volume{}, err
	}
	next := *v
	switch {
	case v.Writer != "":
		return Volume{}, fmt.Errorf("volume %s: mounted read-write by sandbox %s: %w", v.Name, v.Writer, errdefs.ErrConflict)
	case !readOnly && len(v.Readers) > 0:
		return Volume{}, fmt.Errorf("volume %s: mounted read-only by sandboxes %v; a read-write mount needs it alone: %w", v.Name, v.Readers, errdefs.ErrConflict)
	case readOnly:
		next.Readers = append(slices.Clone(v.Readers), sandbox)
	default:
		next.Writer = sandbox
	}
	if err := s.persist(next); err != nil {
		return Volume{}, err
	}
	*v = next
	return next, nil
}

// Release records that sandbox no longer mounts the volume of id, keeping
// nothing it wrote (a create that failed, a reader). A volume already gone
// or not held by sandbox is no error.
func (s *Store) Release(id, sandbox string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[id]
	if !ok || !slices.Contains(v.Holders(), sandbox) {
		return nil
	}
	next := without(*v, sandbox)
	if err := s.persist(next); err != nil {
		return fmt.Errorf("release volume %s: %w", v.Name, err)
	}
	*v = next
	return nil
}

// Commit makes config, an image config of sealed layers the writer
// sandbox stacked on the volume's (some in its own directory, owner), the
// volume's content and releases it: the sandbox's layers are hard-linked
// into the volume's directory first, so they outlive the sandbox's.
func (s *Store) Commit(id, sandbox, config, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[id]
	if !ok || v.Writer != sandbox {
		return fmt.Errorf("commit volume %s: sandbox %s does not mount it read-write: %w", id, sandbox, errdefs.ErrConflict)
	}
	layers, err := snapshot.LayersOf(config)
	if err != nil {
		return fmt.Errorf("commit volume %s: %w", v.Name, err)
	}
	vdir := filepath.Join(s.dir, v.ID)
	next := without(*v, sandbox)
	next.Gen++
	own, err := adopt(layers, owner, vdir, next.Gen)
	if err != nil {
		return fmt.Errorf("commit volume %s: %w", v.Name, err)
	}
	next.Config = filepath.Join(vdir, fmt.Sprintf("image-%d.json", next.Gen))
	if err := snapshot.WriteImageConfig(next.Config, own); err != nil {
		return fmt.Errorf("commit volume %s: %w", v.Name, err)
	}
	if err := fpCommitLinks.Inject(); err != nil {
		return fmt.Errorf("commit volume %s: %w", v.Name, err)
	}
	if err := s.persist(next); err != nil {
		return fmt.Errorf("commit volume %s: %w", v.Name, err)
	}
	old := v.Config
	*v = next
	_ = os.Remove(old) // the writer held the volume alone: nothing else reads that config
	return nil
}

// adopt hard-links the layers under owner into vdir as layer-<gen>-<i>
// (names no earlier commit used; a link a crashed commit of the same gen
// left is replaced) and returns the list with their new paths.
func adopt(layers []string, owner, vdir string, gen int) ([]string, error) {
	out := slices.Clone(layers)
	prefix := filepath.Clean(owner) + string(filepath.Separator)
	for i, l := range layers {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		dst := filepath.Join(vdir, fmt.Sprintf("layer-%d-%d.lsmt", gen, i))
		_ = os.Remove(dst)
		if err := snapshot.LinkOrCopy(l, dst); err != nil {
			return nil, err
		}
		out[i] = dst
	}
	return out, atomicfile.SyncDir(vdir)
}

// ReleaseAbsent releases every mount of a sandbox live does not know (its
// record is gone: a kill or a failed create that a crash interrupted); what
// such a writer wrote after its volume's last commit is lost.
func (s *Store) ReleaseAbsent(live func(sandbox string) bool) {
	s.mu.Lock()
	var stale [][2]string
	for _, v := range s.vols {
		for _, h := range v.Holders() {
			if !live(h) {
				stale = append(stale, [2]string{v.ID, h})
			}
		}
	}
	s.mu.Unlock()
	for _, p := range stale {
		if err := s.Release(p[0], p[1]); err != nil {
			s.log.Warn("release the mount of a sandbox that is gone", "volume", p[0], "sandbox", p[1], "err", err)
			continue
		}
		s.log.Info("released the mount of a sandbox that is gone", "volume", p[0], "sandbox", p[1])
	}
}

// without is v with sandbox among neither its writer nor its readers.
func without(v Volume, sandbox string) Volume {
	if v.Writer == sandbox {
		v.Writer = ""
	}
	v.Readers = slices.DeleteFunc(slices.Clone(v.Readers), func(r string) bool { return r == sandbox })
	if len(v.Readers) == 0 {
		v.Readers = nil
	}
	return v
}
