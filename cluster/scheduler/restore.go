package scheduler

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A sandbox's snapshot is taken by the node that runs it, so what it needs
// to be restored is that node's platform: every binding records it
// ("needs" in the bind hash, a NodeStatus holding only the platform
// fields) when the sandbox is bound to a node. A resume elsewhere is placed
// only on a node whose platform matches:
//
//   - the same VMM driver (a QEMU state file is no Firecracker snapshot);
//   - the same accelerator (a KVM snapshot does not load under TCG, nor the
//     other way: the guest CPU differs);
//   - under KVM, the same host CPU model and every CPU flag of the source
//     (the guest saw the host's CPU and may use any of its features);
//   - under TCG the guest CPU is emulated, so the host CPU does not matter;
//     a node with the source's TSC frequency (within 1 %) is preferred,
//     since the guest's clock was calibrated against it.
//
// A binding recorded by a node that reports no platform (an older node)
// constrains nothing.

// tscTolerance is the relative TSC difference a restore is taken to keep.
const tscTolerance = 0.01

// needsOf is the platform part of a node's status, as a snapshot taken
// there needs it; nil when the node reports none.
func needsOf(st *pb.NodeStatus) []byte {
	if st.GetVmm() == "" && st.GetAccel() == "" {
		return nil
	}
	b, _ := proto.Marshal(&pb.NodeStatus{Name: st.GetName(), Vmm: st.GetVmm(), Accel: st.GetAccel(),
		CpuModel: st.GetCpuModel(), CpuFlags: st.GetCpuFlags(), TscKhz: st.GetTscKhz()})
	return b
}

// loadNeeds reads what sandbox id's snapshot needs (nil: nothing known).
func (s *Scheduler) loadNeeds(ctx context.Context, id string) (*pb.NodeStatus, error) {
	raw, err := s.rdb.HGet(ctx, s.k.bind(id), "needs").Result()
	if isNil(err) || (err == nil && raw == "") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read restore needs of %s: %w", id, err)
	}
	n := &pb.NodeStatus{}
	if err := proto.Unmarshal([]byte(raw), n); err != nil {
		return nil, fmt.Errorf("decode restore needs of %s: %w", id, err)
	}
	return n, nil
}

// describeNeeds names a platform for messages.
func describeNeeds(n *pb.NodeStatus) string {
	d := n.GetVmm() + "/" + n.GetAccel()
	if n.GetAccel() == "kvm" {
		d += fmt.Sprintf(" on CPU %q", n.GetCpuModel())
	}
	return d
}

// cannotRestore says why a node cannot restore a snapshot that needs n
// ("" when it can).
func cannotRestore(n, st *pb.NodeStatus) string {
	var why []string
	if n.GetVmm() != "" && st.GetVmm() != n.GetVmm() {
		why = append(why, fmt.Sprintf("VMM %q, not %q", st.GetVmm(), n.GetVmm()))
	}
	if n.GetAccel() != "" && st.GetAccel() != n.GetAccel() {
		why = append(why, fmt.Sprintf("accelerator %q, not %q", st.GetAccel(), n.GetAccel()))
	}
	if n.GetAccel() == "kvm" && st.GetAccel() == "kvm" {
		if st.GetCpuModel() != n.GetCpuModel() {
			why = append(why, fmt.Sprintf("CPU %q, not %q", st.GetCpuModel(), n.GetCpuModel()))
		}
		var missing []string
		for _, f := range n.GetCpuFlags() {
			if !slices.Contains(st.GetCpuFlags(), f) {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			if len(missing) > 8 {
				missing = append(missing[:8], fmt.Sprintf("and %d more", len(missing)-8))
			}
			why = append(why, "CPU flags missing: "+strings.Join(missing, " "))
		}
	}
	return strings.Join(why, ", ")
}

// sameTSC is a node whose TSC is within tscTolerance of the snapshot's.
func sameTSC(n, st *pb.NodeStatus) bool {
	want := float64(n.GetTscKhz())
	return want <= 0 || math.Abs(float64(st.GetTscKhz())-want) <= want*tscTolerance
}

// restorable narrows the candidates to those that can restore a snapshot
// needing n (preferring, under TCG, the ones with its TSC). With none, the
// error explains: FailedPrecondition when no live node but the excluded
// ones (the source, down or refusing) could restore it (the gateway answers
// 409), ResourceExhausted when some could but are full or draining, or no
// node is up (503: retry).
func (s *Scheduler) restorable(id string, n *pb.NodeStatus, cands []candidate, nodes map[string]*nodeRecord, exclude []string) ([]candidate, error) {
	var ok []candidate
	for _, c := range cands {
		if cannotRestore(n, c.r.status) == "" {
			ok = append(ok, c)
		}
	}
	if len(ok) > 0 {
		if n.GetAccel() == "tcg" {
			if same := slices.DeleteFunc(slices.Clone(ok), func(c candidate) bool { return !sameTSC(n, c.r.status) }); len(same) > 0 {
				return same, nil
			}
		}
		return ok, nil
	}
	var live, busy, down []string
	for _, name := range sortedNames(nodes) {
		r := nodes[name]
		why := cannotRestore(n, r.status)
		switch {
		case why != "" && !s.isDown(r):
			live = append(live, name+": "+why)
		case why == "" && (s.isDown(r) || slices.Contains(exclude, name)):
			down = append(down, name)
		case why == "":
			busy = append(busy, name)
		}
	}
	msg := fmt.Sprintf("sandbox %s was paused under %s", id, describeNeeds(n))
	if len(busy) > 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "%s; the nodes that can restore it (%s) are full, draining or refused it",
			msg, strings.Join(busy, ", "))
	}
	if len(live) == 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "%s and no node is up", msg)
	}
	msg = fmt.Sprintf("%s and no live node can restore it (%s)", msg, strings.Join(live, "; "))
	if len(down) > 0 {
		msg += fmt.Sprintf("; nodes that could are down or refused it: %s", strings.Join(down, ", "))
	}
	return nil, status.Error(codes.FailedPrecondition, msg)
}

func sortedNames(nodes map[string]*nodeRecord) []string {
	out := make([]string, 0, len(nodes))
	for n := range nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// restoreCandidates is restorable for Place's restore_of (a sandbox whose
// needs are unknown may go anywhere).
func (s *Scheduler) restoreCandidates(ctx context.Context, id string, cands []candidate, nodes map[string]*nodeRecord, exclude []string) ([]candidate, error) {
	if err := checkName("sandbox id", id); err != nil {
		return nil, err
	}
	n, err := s.loadNeeds(ctx, id)
	if err != nil {
		return nil, internal(err)
	}
	if n == nil {
		return cands, nil
	}
	return s.restorable(id, n, cands, nodes, exclude)
}
