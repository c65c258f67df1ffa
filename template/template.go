// Package template owns templates: what a template is (a committed VM
// snapshot sandboxes are created from, with its root disk and defaults) and
// how one is built (E2B's v2/v3 template API: a template is created, then a
// build spec runs in a build VM: fromImage or fromTemplate, steps,
// startCmd, readyCmd; the VM is snapshotted and its disk sealed). The node's
// catalog of committed templates, and the first boot of the default one,
// belong to the orchestrator, which is the Builder's Host.
package template

import (
	"maps"
	"slices"
	"time"

	"github.com/agentenv/agentenv/snapshot"
)

// DefaultID is the id of the template the node builds from the guest
// assets at its first start.
const DefaultID = "base"

// AgentVersion is the envd version a template reports until its agent's
// own /init answer is known.
const AgentVersion = "0.6.4"

// Template is a committed snapshot sandboxes are created from.
type Template struct {
	ID       string `json:"id"`
	Dir      string `json:"dir"`              // templates/<id>
	Snapshot string `json:"snapshot"`         // <dir>/snapshot
	Rootfs   string `json:"rootfs,omitempty"` // file mode: <dir>/rootfs.ext4, the disk as of the snapshot
	// RootfsImage (daemon mode) is the image config of the disk as of the
	// snapshot: the imported base layer and the sealed boot upper.
	RootfsImage string `json:"rootfsImage,omitempty"`
	VCPUs       int    `json:"vcpus"`
	MemoryMiB   int    `json:"memoryMiB"`
	// MemoryTargetMiB is set on a snapshot seen as a template
	// (snapshot.Record's): the resize target its guest runs on.
	MemoryTargetMiB int       `json:"memoryTargetMiB,omitempty"`
	DiskMiB         int       `json:"diskMiB"`
	EnvdVersion     string    `json:"envdVersion"`
	CreatedAt       time.Time `json:"createdAt"`
	// DriveSlots is how many empty drive slots the snapshot's VM has after
	// its root disk (sandbox.DriveSlots): a sandbox created from it may
	// bring that many extra drives. Drives are the drives a snapshot seen
	// as a template carries in its slots.
	DriveSlots int              `json:"driveSlots,omitempty"`
	Drives     []snapshot.Drive `json:"-"`
	// GuestToken is the access token the snapshot's agent holds (a snapshot
	// of a secure sandbox seen as a template; templates have none).
	GuestToken string `json:"-"`

	// Built templates (build.go). Names are the template's names (E2B's
	// aliases), usable instead of its id. Status is "" or ready once a build
	// committed a snapshot; waiting, building or error before that.
	Names       []string                `json:"names,omitempty"`
	Tags        []string                `json:"tags,omitempty"`
	Status      string                  `json:"status,omitempty"`
	BuildID     string                  `json:"buildID,omitempty"`     // the build the snapshot comes from
	LatestBuild string                  `json:"latestBuild,omitempty"` // the newest build
	Builds      map[string]*BuildRecord `json:"builds,omitempty"`
	// Parent is the template a fromTemplate build restored (its snapshot
	// files are shared).
	Parent string `json:"parent,omitempty"`
	// DefaultUser, DefaultWorkdir and Env are the final USER, WORKDIR and
	// ENV of the build, set in the agent before the snapshot.
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	UpdatedAt      time.Time         `json:"updatedAt,omitzero"`
	// Origin is the repository manifest a template built on another node
	// was brought from (adopt.go); such a template is not committed again.
	Origin string `json:"origin,omitempty"`
}

// Ready reports whether t's build committed a snapshot (built templates)
// or t needs no build (the default template, snapshots seen as templates).
func (t *Template) Ready() bool { return t.Status == "" || t.Status == BuildReady }

// Clone returns a deep copy of t.
func (t *Template) Clone() *Template {
	c := *t
	c.Names = slices.Clone(t.Names)
	c.Tags = slices.Clone(t.Tags)
	c.Env = maps.Clone(t.Env)
	c.Builds = make(map[string]*BuildRecord, len(t.Builds))
	for k, v := range t.Builds {
		bv := *v
		c.Builds[k] = &bv
	}
	return &c
}
