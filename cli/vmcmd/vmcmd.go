// Package vmcmd is `aenvd vm`: boot a sandbox VM on this machine straight
// from the guest assets, without a node server. It lives in the node's
// binary, which links the VMM and network packages anyway, so the `aenv`
// CLI links neither. It is the quickest way to see
// the whole ground floor work together (guest image, QEMU driver, network
// slot, agent, snapshot and restore) and the README's first command.
package vmcmd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/spf13/cobra"
)

// NewCommand returns `aenvd vm`.
func NewCommand() *cobra.Command {
	root := &cobra.Command{Use: "vm", Short: "Run sandbox VMs directly on this machine (no server)"}
	root.AddCommand(newRun())
	return root
}

type runOpts struct {
	agent     string
	memoryMiB int
	vcpus     int
	snapshot  bool
	workDir   string
}

func newRun() *cobra.Command {
	var o runOpts
	cmd := &cobra.Command{
		Use:   "run [-- COMMAND...]",
		Short: "Boot a VM, run a command in it through the agent, snapshot, restore, run it again",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"uname -a; . /etc/os-release; echo $PRETTY_NAME; python3 --version; id"}
			}
			return run(cmd.Context(), o, strings.Join(args, " "))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.agent, "agent", "", "aenv-agent binary (default: next to this binary)")
	f.IntVar(&o.memoryMiB, "memory", 512, "guest memory in MiB")
	f.IntVar(&o.vcpus, "cpus", 1, "guest vCPUs")
	f.BoolVar(&o.snapshot, "snapshot", true, "also pause, snapshot, restore and run the command in the restored VM")
	f.StringVar(&o.workDir, "work-dir", "", "where run files and snapshots go (default: a temporary directory, removed)")
	return cmd
}

func run(ctx context.Context, o runOpts, script string) error {
	if o.agent == "" {
		exe, _ := os.Executable()
		o.agent = filepath.Join(filepath.Dir(exe), "aenv-agent")
	}
	step := stepper()
	assets, err := image.Build(ctx, image.Options{Agent: o.agent})
	if err != nil {
		return err
	}
	step("guest assets ready (%s)", assets.Dir)
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: assets.Kernel})
	if err != nil {
		return err
	}
	accel, why := d.Accel()
	step("qemu driver: %s (%s)", accel, why)
	work := o.workDir
	if work == "" {
		if work, err = os.MkdirTemp("", "aenv-vm-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	nets, err := network.New(ctx, network.Config{Prefix: "aenvq"})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer nets.Shutdown(context.WithoutCancel(ctx))

	vm, slot, err := boot(ctx, d, nets, assets, o, filepath.Join(work, "boot"))
	if err != nil {
		return err
	}
	step("booted; agent ready")
	if err := exec(ctx, slot, script); err != nil {
		_ = vm.Stop(ctx)
		return err
	}
	if !o.snapshot {
		return vm.Stop(ctx)
	}
	if err := vm.Pause(ctx); err != nil {
		return err
	}
	snap, err := vm.Snapshot(ctx, filepath.Join(work, "snapshot"))
	_ = vm.Stop(ctx)
	_ = nets.Release(ctx, slot)
	if err != nil {
		return err
	}
	step("snapshot written: state %d KiB", snap.StateBytes>>10)
	slot, err = nets.Acquire(ctx)
	if err != nil {
		return err
	}
	defer nets.Release(context.WithoutCancel(ctx), slot)
	tap, err := slot.OpenTap()
	if err != nil {
		return err
	}
	defer tap.Close()
	rvm, err := d.Restore(ctx, vmm.RestoreConfig{ID: "restored", SnapshotDir: snap.Dir, RunDir: filepath.Join(work, "restored"),
		NICs: []vmm.NIC{{ID: "eth0", MAC: slot.Guest().MAC.String(), Tap: tap}}})
	if err != nil {
		return err
	}
	defer rvm.Stop(context.WithoutCancel(ctx))
	if err := waitAgent(ctx, slot); err != nil {
		return err
	}
	step("restored from snapshot; agent ready")
	return exec(ctx, slot, script)
}

func boot(ctx context.Context, d vmm.Driver, nets *network.Manager, a *image.Assets, o runOpts, runDir string) (vmm.Machine, *network.Slot, error) {
	slot, err := nets.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	tap, err := slot.OpenTap()
	if err != nil {
		return nil, nil, err
	}
	defer tap.Close()
	g := slot.Guest()
	vm, err := d.Boot(ctx, vmm.Config{
		ID: "quickstart", Kernel: a.Kernel, Initrd: a.Initrd, VCPUs: o.vcpus, MemoryMiB: o.memoryMiB, RunDir: runDir,
		Cmdline: fmt.Sprintf("root=/dev/vda ro quiet %s aenv.dns=%s", g.KernelIPArg(), g.Nameserver),
		Drives:  []vmm.Drive{{ID: "rootfs", Path: a.Rootfs, ReadOnly: true}},
		NICs:    []vmm.NIC{{ID: "eth0", MAC: g.MAC.String(), Tap: tap}},
	})
	if err != nil {
		return nil, nil, err
	}
	if err := waitAgent(ctx, slot); err != nil {
		_ = vm.Stop(ctx)
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		return nil, nil, fmt.Errorf("%w\nguest console:\n%s", err, console)
	}
	return vm, slot, nil
}

func client(slot *network.Slot) (*http.Client, string) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return slot.DialGuest(ctx, "tcp", 49983)
	}}
	return &http.Client{Transport: tr}, "http://sandbox:49983"
}

func waitAgent(ctx context.Context, slot *network.Slot) error {
	hc, base := client(slot)
	hc.Timeout = 2 * time.Second
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := hc.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	return fmt.Errorf("agent did not answer within 3 minutes")
}

func exec(ctx context.Context, slot *network.Slot, script string) error {
	hc, base := client(slot)
	out, errOut, code, err := agentclient.Run(ctx, base, hc, "/bin/bash", "-l", "-c", script)
	if err != nil {
		return err
	}
	os.Stdout.Write(out)
	os.Stderr.Write(errOut)
	if code != 0 {
		return fmt.Errorf("command exited with %d", code)
	}
	return nil
}

func stepper() func(format string, args ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
}
