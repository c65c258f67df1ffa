// Package vmmselect chooses the VMM driver for a node: Firecracker when its
// binary runs and /dev/kvm opens, else QEMU under KVM when a test guest boots
// with it, else QEMU under TCG. It says which and why, for logs and /nodes.
package vmmselect

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/firecracker"
	"github.com/agentenv/agentenv/vmm/qemu"
)

// Options say what may be chosen.
type Options struct {
	// Prefer is "auto" (default), "firecracker" or "qemu".
	Prefer string
	// Firecracker is the firecracker binary; empty means from PATH.
	Firecracker string
	// QEMU is the QEMU binary; empty means qemu-system-x86_64.
	QEMU string
	// Kernel boots the QEMU KVM probe.
	Kernel string
	// Accel forces QEMU's accelerator ("kvm", "tcg"); empty detects.
	Accel string
	Log   *slog.Logger
}

// Choice is the selected driver and the reason.
type Choice struct {
	Driver vmm.Driver
	Name   string // "firecracker", "qemu-kvm" or "qemu-tcg"
	Reason string
}

// Select picks a driver.
func Select(ctx context.Context, o Options) (*Choice, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	var fcErr error
	switch o.Prefer {
	case "", "auto", "firecracker":
		c, err := tryFirecracker(ctx, o)
		if err == nil {
			o.Log.Info("vmm selected", "driver", c.Name, "why", c.Reason)
			return c, nil
		}
		if o.Prefer == "firecracker" {
			return nil, fmt.Errorf("select vmm: firecracker requested: %w", err)
		}
		fcErr = err
	case "qemu":
	default:
		return nil, fmt.Errorf("select vmm: unknown driver %q (want auto, firecracker or qemu)", o.Prefer)
	}
	d, err := qemu.New(ctx, qemu.Options{Binary: o.QEMU, ProbeKernel: o.Kernel, Accel: o.Accel, Log: o.Log})
	if err != nil {
		return nil, fmt.Errorf("select vmm: %w", err)
	}
	accel, why := d.Accel()
	reason := why
	if fcErr != nil {
		reason = fmt.Sprintf("firecracker unusable (%v); qemu %s: %s", fcErr, accel, why)
	}
	c := &Choice{Driver: d, Name: "qemu-" + accel, Reason: reason}
	o.Log.Info("vmm selected", "driver", c.Name, "why", c.Reason)
	return c, nil
}

func tryFirecracker(ctx context.Context, o Options) (*Choice, error) {
	version, err := firecracker.Probe(ctx, o.Firecracker)
	if err != nil {
		return nil, err
	}
	d, err := firecracker.New(firecracker.Options{Binary: o.Firecracker, Log: o.Log})
	if err != nil {
		return nil, err
	}
	return &Choice{Driver: d, Name: "firecracker", Reason: version + " with a usable /dev/kvm"}, nil
}
