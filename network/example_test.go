package network_test

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/network"
)

// How a node wires slots to a VM and the sandbox proxy (compiled, not run:
// it needs root).
func Example() {
	ctx := context.Background()
	m, err := network.New(ctx, network.Config{PoolLow: 8, PoolHigh: 32})
	if err != nil {
		panic(err)
	}
	defer m.Shutdown(ctx)

	slot, err := m.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	defer m.Release(ctx, slot) // after the VM stopped

	// The sandbox's egress policy (API: allow_internet_access, allowOut, denyOut).
	if err := slot.SetPolicy(ctx, network.Policy{DenyInternet: true, AllowOut: []string{"pypi.org", "*.pythonhosted.org"}}); err != nil {
		panic(err)
	}

	// The VMM gets an open tap (vmm.NIC{ID: "eth0", MAC: guest.MAC.String(), Tap: tap, TapName: network.TapName})
	// and the guest its address on the kernel command line.
	tap, err := slot.OpenTap()
	if err != nil {
		panic(err)
	}
	defer tap.Close()
	guest := slot.Guest()
	fmt.Println(guest.KernelIPArg())

	// The proxy reaches guest port 49983 (the agent) here:
	fmt.Println(slot.GuestAddr(49983))
}
