package volume

import (
	"fmt"
	"path"
	"strings"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Mount is a create's volume: mounted at Path in the guest.
type Mount struct {
	Volume   string // the volume's id or name
	Path     string
	ReadOnly bool
}

// maxMountPath bounds a mount path (Linux's PATH_MAX is 4096).
const maxMountPath = 1024

// CheckMounts validates a create's volume mounts, at most max of them,
// without looking anything up.
func CheckMounts(ms []Mount, max int) error {
	if len(ms) > max {
		return fmt.Errorf("volumeMounts: %d given, at most %d: %w", len(ms), max, errdefs.ErrInvalid)
	}
	seen := map[string]bool{}
	for i, m := range ms {
		switch {
		case m.Volume == "":
			return fmt.Errorf("volumeMounts[%d]: name the volume: %w", i, errdefs.ErrInvalid)
		case len(m.Path) > maxMountPath || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" ||
			strings.ContainsAny(m.Path, "\x00\n"):
			return fmt.Errorf("volumeMounts[%d]: path %q: want a clean absolute path other than /, at most %d bytes: %w", i, m.Path, maxMountPath, errdefs.ErrInvalid)
		case seen[m.Path]:
			return fmt.Errorf("volumeMounts[%d]: path %q is mounted twice: %w", i, m.Path, errdefs.ErrInvalid)
		}
		seen[m.Path] = true
	}
	return nil
}
