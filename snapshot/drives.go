package snapshot

// Drive is an extra block drive of a sandbox or of a snapshot (storage
// daemon disks only): a stack of sealed layers like a root disk, in one of
// the VM's drive slots. A writable drive's upper is sealed with the root
// disk's (pause, snapshot) and a sandbox created from a snapshot stacks a
// new upper on the snapshot's layers: its own copy-on-write view. A
// read-only drive is never written, so every user shares its layers.
type Drive struct {
	// Slot is the drive's slot, 1-based: the guest's /dev/vdb for 1.
	Slot int `json:"slot"`
	// Image is the template or snapshot whose root disk the drive started
	// from; empty for a blank volume.
	Image string `json:"image,omitempty"`
	// SizeMiB is a blank volume's size.
	SizeMiB  int  `json:"sizeMiB,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	// Config is the image config the drive's device is created from.
	Config string `json:"config"`
	// MountPath is where the guest mounts the drive's filesystem: a
	// volume's, or a snapshot's copy of one (orchestrator/volumes.go).
	MountPath string `json:"mountPath,omitempty"`
}

// DriveRefs lists the layer files of drives' image configs.
func DriveRefs(drives []Drive) []string {
	var out []string
	for _, d := range drives {
		out = append(out, Refs(d.Config)...)
	}
	return out
}
