package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
)

// GroupName is the name of the control group of the VM named id (a
// sandbox's "<id>-<gen>", a warm-pool entry's name). It carries no sandbox
// id: control-group folders and /proc/<pid>/cgroup are readable by every
// local user, and a sandbox's id is a secret (with it, a local user could
// reach a non-secure sandbox through the proxy). A digest of a 20-character
// random id cannot be turned back into it, and it stays a pure function of
// the name, so a restarted node finds the group of a VM it adopts.
func GroupName(id string) string {
	sum := sha256.Sum256([]byte("aenv-vmm-group\x00" + id))
	return "vm-" + hex.EncodeToString(sum[:12])
}
