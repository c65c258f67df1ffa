package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// platform sets a node status's platform fields.
func platform(st *pb.NodeStatus, accel, model string, tsc int64, flags ...string) *pb.NodeStatus {
	st.Accel, st.CpuModel, st.TscKhz, st.CpuFlags = accel, model, tsc, flags
	return st
}

// placeRestore places the resume of id, excluding the nodes named.
func placeRestore(c pb.SchedulerClient, id string, exclude ...string) (string, error) {
	p, err := c.Place(context.Background(), &pb.PlaceRequest{Resources: &pb.Resources{}, Exclude: exclude, RestoreOf: id})
	if err != nil {
		return "", err
	}
	return p.GetNode().GetStatus().GetName(), nil
}

// A sandbox bound to a KVM node needs KVM, its CPU model and flags: its
// resume is never placed on a TCG node, and with only TCG nodes (or KVM
// nodes lacking a flag) up, Place refuses with a message naming what is
// missing.
func TestRestorePlacementKVMNeverOnTCG(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	r := startReplica(t, rs, "r1", clk, nil)
	c := r.client
	register(t, c, platform(status0("kvm1", 8, 8192), "kvm", "Xeon 8375C", 2900000, "sse4_2", "avx2", "avx512f"))
	register(t, c, platform(status0("tcg1", 64, 65536), "tcg", "EPYC 7B13", 2450000, "sse4_2", "avx2"))
	register(t, c, platform(status0("tcg2", 64, 65536), "tcg", "Xeon 8375C", 2900000, "sse4_2", "avx2", "avx512f"))
	bind(t, c, "sbx-kvm", "kvm1")

	// The only node that can restore it is the one that paused it.
	for range 5 {
		n, err := placeRestore(c, "sbx-kvm")
		if err != nil || n != "kvm1" {
			t.Fatalf("place restore of a KVM snapshot: node %q, %v; want kvm1", n, err)
		}
	}
	// That node excluded (it is down, or refused): the TCG nodes are up but
	// cannot restore it. 409-worthy, with the reason.
	_, err := placeRestore(c, "sbx-kvm", "kvm1")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore with only TCG nodes left: %v; want FailedPrecondition", err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `accelerator "tcg", not "kvm"`) || !strings.Contains(msg, "tcg1") {
		t.Fatalf("refusal does not name what is missing: %s", msg)
	}
	// A KVM node of the same model lacking a flag cannot take it either.
	register(t, c, platform(status0("kvm2", 64, 65536), "kvm", "Xeon 8375C", 2900000, "sse4_2", "avx2"))
	_, err = placeRestore(c, "sbx-kvm", "kvm1")
	if msg := status.Convert(err).Message(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "CPU flags missing: avx512f") {
		t.Fatalf("restore on a KVM node lacking avx512f: %v", err)
	}
	// One with every flag (and more) can.
	register(t, c, platform(status0("kvm3", 1, 1024), "kvm", "Xeon 8375C", 2900000, "sse4_2", "avx2", "avx512f", "amx"))
	if n, err := placeRestore(c, "sbx-kvm", "kvm1"); err != nil || n != "kvm3" {
		t.Fatalf("restore with a matching KVM node up: %q, %v; want kvm3", n, err)
	}
	// Plain creates are not constrained: the 64-CPU nodes are least loaded.
	p, err := c.Place(context.Background(), &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1}})
	if n := p.GetNode().GetStatus().GetName(); err != nil || (n != "tcg1" && n != "tcg2" && n != "kvm2") {
		t.Fatalf("create placement: %v %v", p, err)
	}
}

// A TCG snapshot goes to TCG nodes only, preferring one with the source's
// TSC; when the only nodes that could restore it are down, the answer is
// retryable (ResourceExhausted: 503), naming them.
func TestRestorePlacementTCG(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	r := startReplica(t, rs, "r1", clk, nil)
	c := r.client
	register(t, c, platform(status0("src", 4, 4096), "tcg", "EPYC", 2450000))
	register(t, c, platform(status0("tcg-slow", 64, 65536), "tcg", "Xeon", 2000000))
	register(t, c, platform(status0("tcg-same", 2, 2048), "tcg", "Xeon", 2451000))
	register(t, c, platform(status0("kvm", 64, 65536), "kvm", "EPYC", 2450000))
	bind(t, c, "sbx-tcg", "src")
	for range 5 {
		if n, err := placeRestore(c, "sbx-tcg", "src"); err != nil || n != "tcg-same" {
			t.Fatalf("restore of a TCG snapshot: %q, %v; want tcg-same (same TSC)", n, err)
		}
	}
	if n, err := placeRestore(c, "sbx-tcg", "src", "tcg-same"); err != nil || n != "tcg-slow" {
		t.Fatalf("restore of a TCG snapshot without a same-TSC node: %q, %v; want tcg-slow", n, err)
	}
	// The TCG nodes go silent; only the KVM node is left up.
	clk.Add(6 * time.Second)
	if _, err := c.Heartbeat(context.Background(), &pb.HeartbeatRequest{Status: platform(status0("kvm", 64, 65536), "kvm", "EPYC", 2450000)}); err != nil {
		t.Fatal(err)
	}
	_, err := placeRestore(c, "sbx-tcg")
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "nodes that could are down or refused it: src, tcg-same, tcg-slow") {
		t.Fatalf("restore with only a KVM node up: %v", err)
	}
	// A node that reports no platform (older) records no needs: anywhere.
	register(t, c, status0("old", 4, 4096))
	bind(t, c, "sbx-old", "old")
	if n, err := placeRestore(c, "sbx-old", "old"); err != nil || n != "kvm" {
		t.Fatalf("restore of a sandbox without recorded needs: %q, %v", n, err)
	}
}
