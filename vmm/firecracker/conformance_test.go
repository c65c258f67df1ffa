package firecracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// TestConformance runs the shared vmm suite (vmm/vmmtest) against a real
// Firecracker. It needs AENV_TEST_FIRECRACKER=/path/to/firecracker and a
// /dev/kvm that runs Firecracker guests; AENV_TEST_FIRECRACKER_KERNEL may
// name an uncompressed vmlinux, since Firecracker on x86 boots ELF kernels
// only.
func TestConformance(t *testing.T) {
	bin := os.Getenv("AENV_TEST_FIRECRACKER")
	if bin == "" {
		t.Skip("AENV_TEST_FIRECRACKER is not set: no firecracker binary to run the conformance suite against")
	}
	if err := kvmUsable(); err != nil {
		t.Skipf("no usable KVM for Firecracker: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the suite creates network namespaces and taps")
	}
	d, err := New(Options{Binary: bin})
	if err != nil {
		t.Fatal(err)
	}
	a := guestassets.Get(t)
	kernel := a.Kernel
	if k := os.Getenv("AENV_TEST_FIRECRACKER_KERNEL"); k != "" {
		kernel = k
	}
	vmmtest.Run(t, vmmtest.Harness{Driver: &tapsByName{Driver: d}, Kernel: kernel, Initrd: a.Initrd, Rootfs: a.Rootfs})
}

// kvmUsable opens /dev/kvm the way Firecracker does.
func kvmUsable() error {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	return unix.Close(fd)
}

// tapsByName adapts the suite's NICs, open tap files in per-test network
// namespaces, to what Firecracker takes: a tap name inside the namespace the
// VMM runs in. It makes each tap persistent and closes the suite's file
// (a tap attached elsewhere refuses Firecracker with EBUSY); the tap goes
// away with the suite's namespace.
type tapsByName struct {
	vmm.Driver
}

func (a *tapsByName) Boot(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	nics, netns, release, err := tapNames(cfg.NICs)
	if err != nil {
		return nil, err
	}
	defer release()
	cfg.NICs = nics
	if cfg.NetNS == "" {
		cfg.NetNS = netns
	}
	return a.Driver.Boot(ctx, cfg)
}

func (a *tapsByName) Restore(ctx context.Context, cfg vmm.RestoreConfig) (vmm.Machine, error) {
	nics, netns, release, err := tapNames(cfg.NICs)
	if err != nil {
		return nil, err
	}
	defer release()
	cfg.NICs = nics
	if cfg.NetNS == "" {
		cfg.NetNS = netns
	}
	return a.Driver.Restore(ctx, cfg)
}

// tapNames converts open taps to names. The returned namespace path stays
// valid until release is called (the VMM has joined it by then).
func tapNames(in []vmm.NIC) (out []vmm.NIC, netns string, release func(), err error) {
	var nsFDs []int
	var once sync.Once
	release = func() {
		once.Do(func() {
			for _, fd := range nsFDs {
				_ = unix.Close(fd)
			}
		})
	}
	for _, n := range in {
		if n.Tap == nil || n.TapName != "" {
			out = append(out, n)
			continue
		}
		fd := int(n.Tap.Fd())
		ifr, err := unix.NewIfreq("")
		if err != nil {
			release()
			return nil, "", nil, err
		}
		if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
			release()
			return nil, "", nil, fmt.Errorf("nic %s: TUNGETIFF: %w", n.ID, err)
		}
		nsFD, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS)
		if err != nil {
			release()
			return nil, "", nil, fmt.Errorf("nic %s: TUNGETDEVNETNS: %w", n.ID, err)
		}
		nsFDs = append(nsFDs, nsFD)
		path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), nsFD)
		if netns != "" && !sameFile(netns, path) {
			release()
			return nil, "", nil, errors.New("taps in different network namespaces")
		}
		netns = path
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			release()
			return nil, "", nil, fmt.Errorf("nic %s: TUNSETPERSIST: %w", n.ID, err)
		}
		_ = n.Tap.Close()
		n.Tap, n.TapName = nil, ifr.Name()
		out = append(out, n)
	}
	return out, netns, release, nil
}

func sameFile(a, b string) bool {
	x, err1 := os.Stat(a)
	y, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(x, y)
}

// TestTapsByName checks the adapter with the fake VMM attaching to the tap
// by name inside the namespace, as Firecracker would.
func TestTapsByName(t *testing.T) {
	t.Parallel()
	path := newNetNS(t)
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	var tap *os.File
	if err := inNetNS(path, func() (err error) { tap, err = vmm.OpenTap("tap0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "open-taps", nil)
	cfg := env.config("taps")
	cfg.NICs = []vmm.NIC{{ID: "eth0", MAC: "02:aa:bb:cc:dd:02", Tap: tap}}
	vm, err := (&tapsByName{Driver: d}).Boot(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	calls := readCalls(t, log)
	noFaults(t, calls)
	nic, _ := findCall(calls, "PUT", "/network-interfaces/eth0")
	if nic.Body["host_dev_name"] != "tap0" {
		t.Errorf("nic body %v, want host_dev_name tap0", nic.Body)
	}
	started, _ := findCall(calls, "EXEC", "firecracker")
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	if got := started.Body["netns"]; got != fmt.Sprintf("net:[%d]", want.Ino) {
		t.Errorf("VMM in %v, want the tap's namespace net:[%d]", got, want.Ino)
	}
}
