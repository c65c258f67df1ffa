package kernellane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// KernelPackage is the Debian package whose kernel the lane boots: 6.12
// has ublk (with user recovery and user copy) and nbd as modules and boots
// under TCG. internal/kernelpkg downloads and extracts it.
const KernelPackage = "linux-image-6.12-cloud-amd64"

// ErrNoKernel means the kernel package is neither cached nor downloadable.
var ErrNoKernel = kernelpkg.ErrUnavailable

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("kernel lane: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("kernel lane: hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
