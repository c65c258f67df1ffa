package firecracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/vmm"
)

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
