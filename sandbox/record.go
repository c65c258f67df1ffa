package sandbox

import (
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/snapshot"
)

// A sandbox's lifecycle: its persisted Record, its State, and the Journal
// (journal.go) that is the one writer of that state. The VM bring-up
// (Start) and the verbs that move a sandbox between states use them.

// State is a sandbox's lifecycle state.
type State string

// The states of a sandbox.
const (
	Starting State = "starting"
	Running  State = "running"
	Pausing  State = "pausing"
	Paused   State = "paused"
	Resuming State = "resuming"
	Killing  State = "killing"
)

// Record is the persisted description of a sandbox.
type Record struct {
	ID          string            `json:"id"`
	TemplateID  string            `json:"templateID"`
	State       State             `json:"state"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	AutoPause   bool              `json:"autoPause"`
	AutoResume  bool              `json:"autoResume"`
	Secure      bool              `json:"secure"`
	AccessToken string            `json:"accessToken,omitempty"`
	// GuestToken is the access token the guest's agent holds now: the one
	// of the sandbox a snapshot was taken from until this sandbox's first
	// /init replaces it, then AccessToken. A re-init must present it.
	GuestToken string `json:"guestToken,omitempty"`
	// TrafficToken, when set, must accompany proxied traffic to ports other
	// than the agent's (allowPublicTraffic false).
	TrafficToken string `json:"trafficToken,omitempty"`
	VCPUs        int    `json:"vcpus"`
	MemoryMiB    int    `json:"memoryMiB"`
	DiskMiB      int    `json:"diskMiB"`
	EnvdVersion  string `json:"envdVersion"`
	Dir          string `json:"dir"`
	// RootfsImage is the image config the daemon device is created from
	// (disk/); Device is the live device while the VM runs.
	RootfsImage string `json:"rootfsImage,omitempty"`
	Device      uint32 `json:"device,omitempty"`
	HasDevice   bool   `json:"hasDevice,omitempty"`
	// DriveSlots is how many drive slots the sandbox's VM has; Drives are
	// its extra drives in them (the orchestrator's drives.go).
	DriveSlots int             `json:"driveSlots,omitempty"`
	Drives     []AttachedDrive `json:"drives,omitempty"`
	Snapshot   string          `json:"snapshot,omitempty"` // set while paused
	// FilesystemOnly marks a pause (pausing, paused, or resuming from it)
	// that keeps the disks and no memory image: its resume cold-boots the
	// sandbox from its disk, and traffic cannot auto-resume it.
	FilesystemOnly bool `json:"filesystemOnly,omitempty"`
	// ColdBoot says the VM of this generation boots (or booted) from the
	// disk instead of restoring a memory image: it maps none, whatever
	// Memory still says during its resume.
	ColdBoot bool `json:"coldBoot,omitempty"`
	// AutoPauseFilesystemOnly makes the timeout's auto-pause a
	// filesystem-only one (E2B's autoPauseMemory false).
	AutoPauseFilesystemOnly bool `json:"autoPauseFilesystemOnly,omitempty"`
	// Memory is the layered memory image the running VM maps (empty when
	// its snapshot carried the memory whole).
	Memory snapshot.MemoryImage `json:"memory,omitempty"`
	Gen    int                  `json:"gen"` // bumps on every (re)start of the VM
	PID    int                  `json:"pid,omitempty"`
	// PIDStart is the VMM process's start time (see procStart): with PID it
	// names the process even after the pid was reused.
	PIDStart uint64 `json:"pidStart,omitempty"`
	// PoolClaim says the VMM PID names came from the warm pool and may not
	// have loaded this sandbox's state yet: recovery stops it instead of
	// adopting it (pool.go).
	PoolClaim bool           `json:"poolClaim,omitempty"`
	Slot      int            `json:"slot,omitempty"` // network slot index while the VM runs
	Policy    network.Policy `json:"policy"`

	// MaskRequestHost replaces the Host header of proxied requests
	// (E2B's network.maskRequestHost; "${PORT}" becomes the port).
	MaskRequestHost string `json:"maskRequestHost,omitempty"`

	// CPUPin is the host CPU list (cpulist syntax, canonical) the VMM's
	// vCPU threads are pinned to, again on each new VMM; empty: unpinned.
	CPUPin string `json:"cpuPin,omitempty"`

	// Failure says why the sandbox's last VM ended without being asked to
	// (its VMM crashed or was killed, a memory layer could not be read)
	// or why its last resume failed; a resume that runs clears it.
	Failure string `json:"failure,omitempty"`

	// MemoryTargetMiB is the guest memory the sandbox was resized to
	// (orchestrator's memresize.go), at most MemoryMiB, the RAM its VM
	// starts with; 0: not resized, the guest has all of MemoryMiB.
	MemoryTargetMiB int `json:"memoryTargetMiB,omitempty"`
}

// CommittedMemoryMiB is the guest memory the node counts the sandbox at:
// its resize target, or all of its RAM when it was not resized.
func (r Record) CommittedMemoryMiB() int {
	if r.MemoryTargetMiB > 0 && r.MemoryTargetMiB < r.MemoryMiB {
		return r.MemoryTargetMiB
	}
	return r.MemoryMiB
}

// AttachedDrive is a drive of a sandbox's record with its live device.
type AttachedDrive struct {
	snapshot.Drive
	Device    uint32 `json:"device,omitempty"`
	HasDevice bool   `json:"hasDevice,omitempty"`
	// Fresh: the guest has not seen the drive yet (its slot was empty in
	// the snapshot the sandbox starts from); the next /init has it probed.
	Fresh bool `json:"fresh,omitempty"`
	// Volume is the id of the volume the drive is (volumes.go), mounted
	// in the guest at MountPath; VolumeName its name.
	Volume     string `json:"volume,omitempty"`
	VolumeName string `json:"volumeName,omitempty"`
}

// DiskConfigs are the image configs of the record's root disk and drives.
type DiskConfigs struct {
	rootfs string
	drives []string
}

// DiskConfigs copies the record's image configs (a seal replaces them).
func (r Record) DiskConfigs() DiskConfigs {
	c := DiskConfigs{rootfs: r.RootfsImage}
	for _, d := range r.Drives {
		c.drives = append(c.drives, d.Config)
	}
	return c
}

// SetDiskConfigs puts back configs DiskConfigs copied.
func (r *Record) SetDiskConfigs(c DiskConfigs) {
	r.RootfsImage = c.rootfs
	for i := range r.Drives {
		if i < len(c.drives) {
			r.Drives[i].Config = c.drives[i]
		}
	}
}

// Devices lists the storage-daemon devices r holds: its root disk's and
// its drives'.
func (r Record) Devices() []uint32 {
	var out []uint32
	if r.HasDevice {
		out = append(out, r.Device)
	}
	for _, d := range r.Drives {
		if d.HasDevice {
			out = append(out, d.Device)
		}
	}
	return out
}

// ClearDevices forgets every device of r (they were deleted).
func (r *Record) ClearDevices() {
	r.Device, r.HasDevice = 0, false
	for i := range r.Drives {
		r.Drives[i].Device, r.Drives[i].HasDevice = 0, false
	}
}
