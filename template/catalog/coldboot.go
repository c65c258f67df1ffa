package catalog

import (
	"fmt"
	"maps"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// A filesystem-only pause (E2B's memory: false) keeps a sandbox's disks and
// no memory image. Its resume, like a resume asked not to restore memory,
// cold-boots the sandbox from its disk the way a template's first boot
// does (the same kernel, initrd and command line, through package
// sandbox's one bring-up): a new boot, none of the processes of before,
// the files the guest had flushed to its disk. The guest is asked to flush
// (sync) right before such a pause; what it writes between that and the
// stop of its vCPUs may be lost, as after a crash (E2B's semantics too).

// ColdBootAgentWait bounds a cold boot's wait for the agent: a whole boot
// of the guest, slower than a restore (minutes under TCG).
const ColdBootAgentWait = 5 * time.Minute

// ColdBoot turns spec, a restore of rec's VM, into a cold boot of its disk
// with the kernel and initrd its template booted from. The fresh agent
// holds no token and none of the template's defaults a snapshot kept, so
// its /init carries them: the template's env (under the sandbox's own) and
// working directory.
func (c *Catalog) ColdBoot(spec *sandbox.Spec, rec sandbox.Record) error {
	lineage := c.Lineage(rec.TemplateID)
	kernel, initrd, err := c.BootFiles(lineage)
	if err != nil {
		return fmt.Errorf("cold boot sandbox %s: %w", rec.ID, err)
	}
	spec.Restore, spec.Memory, spec.InitHeld = "", nil, ""
	spec.Boot = &vmm.Config{Kernel: kernel, Initrd: initrd, VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB, Cmdline: BootCmdline}
	spec.AgentWait = ColdBootAgentWait
	env := map[string]string{}
	if len(lineage) > 0 {
		maps.Copy(env, lineage[0].Env)
		spec.Init.DefaultWorkdir = lineage[0].DefaultWorkdir
	}
	maps.Copy(env, rec.EnvVars)
	spec.Init.EnvVars = env
	spec.Init.Drives = nil // a boot probes every drive slot as it is
	return nil
}
