package nodeagent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/cluster/schedtest"
	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/redis/go-redis/v9"
)

// pauseJob writes the files of a pause of sbx1 (content from seed).
func pauseJob(t *testing.T, name string, seed uint64) upload.Job {
	dir := t.TempDir()
	write := func(file string, n int, s uint64) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, repotest.Random(s, n), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return upload.Job{Name: name, Kind: repo.KindSnapshot, Rootfs: []string{write("rootfs.lsmt", 50000, seed)},
		State: write("state", 3000, seed+1), Config: write("config.json", 200, seed+2)}
}

func sandboxOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "sandbox-")
	i := strings.LastIndexByte(rest, '-')
	if !ok || i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// A pause queued while the node owned the sandbox at one generation is not
// committed once the scheduler bound the sandbox elsewhere, nor after it
// came back (a new generation): the repository keeps what the owner
// committed, byte for byte. A pause of a sandbox the node still owns is
// committed. Real Redis, scheduler over gRPC, posix repository.
func TestFenceRefusesStaleCommit(t *testing.T) {
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	s, err := scheduler.New(scheduler.Options{Redis: rdb, Prefix: "f:", HeartbeatInterval: 50 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	served := schedtest.Serve(t, s)
	c := served.Client
	ownFile := filepath.Join(t.TempDir(), "ownership.json")
	src := &fixedSource{u: Usage{CPUs: 8, FreeCPUs: 8, MemoryMB: 4096, FreeMemoryMB: 3000,
		Roster: []Sandbox{{ID: "sbx1", State: "paused"}, {ID: "sbx2", State: "paused"}}}}
	a, err := New(Options{Schedulers: []string{served.Addr}, Name: "n1", APIURL: "http://127.0.0.1:1", VMM: "qemu",
		Source: src, Logger: log, RetryInterval: 50 * time.Millisecond, OwnershipFile: ownFile})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the node never registered")
	}
	for _, id := range []string{"sbx1", "sbx2"} {
		if _, err := c.Bind(ctx, &pb.BindRequest{SandboxId: id, Node: "n1", Resources: &pb.Resources{}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Generation("sbx1") == 0 || a.Generation("sbx2") == 0 || !a.Owns("sbx1") {
		if time.Now().After(deadline) {
			t.Fatal("the scheduler never told the node its ownership")
		}
		time.Sleep(20 * time.Millisecond)
	}
	gen1 := a.Generation("sbx1")

	r, err := posix.Open(t.TempDir(), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := upload.New(r, upload.Options{Dir: t.TempDir(), MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.SetFence(Fence{Agent: a, SandboxOf: sandboxOf})
	stale := pauseJob(t, "sandbox-sbx1-2", 1)
	owned := pauseJob(t, "sandbox-sbx2-2", 2)
	for _, j := range []upload.Job{stale, owned} {
		if err := u.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	// The cluster moves sbx1 to n2, which pauses it and commits first.
	register := func(name string) {
		if _, err := c.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: &pb.NodeStatus{Name: name, ApiUrl: "http://" + name}}); err != nil {
			t.Fatal(err)
		}
	}
	register("n2")
	if _, err := c.Bind(ctx, &pb.BindRequest{SandboxId: "sbx1", Node: "n2", Resources: &pb.Resources{}}); err != nil {
		t.Fatal(err)
	}
	other, err := upload.New(r, upload.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	theirs := pauseJob(t, "sandbox-sbx1-2", 100)
	if err := other.Enqueue(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	other.Start(ctx)
	defer other.Close()
	if st, err := other.Wait(ctx, theirs.Name); err != nil || st.State != upload.Uploaded {
		t.Fatalf("the new owner's commit: %+v %v", st, err)
	}
	want, err := r.Manifest(ctx, theirs.Name)
	if err != nil {
		t.Fatal(err)
	}

	u.Start(ctx)
	defer u.Close()
	st, err := u.Wait(ctx, stale.Name)
	if err != nil || st.State != upload.Failed || !strings.Contains(st.Error, upload.ErrFenced.Error()) || !strings.Contains(st.Error, `"n2"`) {
		t.Fatalf("stale commit: %+v %v; want failed, fenced, naming n2", st, err)
	}
	got, err := r.Manifest(ctx, stale.Name)
	if err != nil || got.State != want.State || got.Rootfs[0].Digest != want.Rootfs[0].Digest {
		t.Fatalf("the repository's manifest changed: %+v (%v), want %+v", got, err, want)
	}
	if st, err := u.Wait(ctx, owned.Name); err != nil || st.State != upload.Uploaded {
		t.Fatalf("commit of a sandbox the node owns: %+v %v", st, err)
	}

	// Moved back: a new generation, so the pause stamped with the old one
	// is still refused.
	if _, err := c.Bind(ctx, &pb.BindRequest{SandboxId: "sbx1", Node: "n1", Resources: &pb.Resources{}}); err != nil {
		t.Fatal(err)
	}
	back, err := c.CheckOwner(ctx, &pb.CheckOwnerRequest{SandboxId: "sbx1", Node: "n1", Gen: gen1})
	if err != nil || back.GetOwner() || back.GetHolder() != "n1" || back.GetGen() <= gen1 {
		t.Fatalf("owner check at the old generation after a move back: %v %v", back, err)
	}
	f := Fence{Agent: a, SandboxOf: sandboxOf}
	// A sandbox bound to no node is not fenced for good: retried.
	if err := f.Check(ctx, "sandbox-unbound-1", "0"); err == nil || errors.Is(err, upload.ErrFenced) {
		t.Fatalf("fence check of an unbound sandbox: %v; want a retryable error", err)
	}
	if err := f.Check(ctx, "sandbox-sbx1-3", strconv.FormatInt(gen1, 10)); !errors.Is(err, upload.ErrFenced) {
		t.Fatalf("fence check with the old generation after a move back: %v", err)
	}
	// The records outlive the process: a new agent reads them back.
	a2, err := New(Options{Schedulers: []string{served.Addr}, Name: "n1", APIURL: "http://x", Source: src, OwnershipFile: ownFile})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if a2.Generation("sbx2") == 0 {
		t.Fatal("ownership records not kept across a restart")
	}
}
