package kernellane

import (
	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// KernelPackage is the Debian package whose kernel the lane boots: 6.12
// has ublk (with user recovery and user copy) and nbd as modules and boots
// under TCG. internal/kernelpkg downloads and extracts it.
const KernelPackage = "linux-image-6.12-cloud-amd64"

// ErrNoKernel means the kernel package is neither cached nor downloadable.
var ErrNoKernel = kernelpkg.ErrUnavailable
