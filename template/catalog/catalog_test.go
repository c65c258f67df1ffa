package catalog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/disk/disktest"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// TestBuildStateSurvivesRestart: without VMs, the build bookkeeping of a
// node: create (and re-create by name), uploads checked by SHA-256, a build
// a restart interrupted marked failed with its reason and log, deletion
// refused while anything uses the template, then done.
func TestBuildStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	devices := disktest.Devices(t)
	disks, err := disk.New(ctx, disk.Options{Devices: devices, Backend: "local"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disks.Close)
	node := &testNode{}
	start := func() *Catalog {
		c := New(Config{DataDir: dir, Store: st, VCPUs: 1, MemoryMiB: 256, DefaultUser: "user", Disks: disks, Node: node,
			Refs: &sync.Mutex{}})
		if err := c.EnableBuilds(ctx, template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseBuilds)
		return c
	}
	c := start()
	tpl, b1, err := c.CreateTemplate(template.Request{Name: "py", Tags: []string{"v1"}})
	if err != nil || tpl.Status != template.BuildWaiting || tpl.VCPUs != 1 || tpl.MemoryMiB != 256 {
		t.Fatalf("create: %+v %v", tpl, err)
	}
	again, b2, err := c.CreateTemplate(template.Request{Name: "py", VCPUs: 2, MemoryMiB: 512})
	if err != nil || again.ID != tpl.ID || b2 == b1 || again.VCPUs != 2 {
		t.Fatalf("re-create by name: %+v %s %v", again, b2, err)
	}
	for _, bad := range []template.Request{{Name: "../x"}, {Name: "ok", MemoryMiB: 64}, {Name: "ok", VCPUs: 1000}} {
		if _, _, err := c.CreateTemplate(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("create %+v: %v", bad, err)
		}
	}
	if err := c.StartBuild(tpl.ID, b1, template.BuildSpec{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("build of a spec naming no base image: %v", err)
	}

	data := []byte("archive bytes")
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if ok, err := c.FilesPresent(tpl.ID, hash); ok || err != nil {
		t.Fatalf("present before upload: %v %v", ok, err)
	}
	// The key is the client's (E2B's SDK names a copy step's filesHash,
	// not the archive's SHA-256): an archive is stored under it unchecked.
	key := strings.Repeat("ab", 32)
	if err := c.PutFiles(ctx, tpl.ID, key, bytes.NewReader([]byte("other bytes"))); err != nil {
		t.Fatalf("upload under a key that is not its sha256: %v", err)
	}
	if ok, err := c.FilesPresent(tpl.ID, key); !ok || err != nil {
		t.Fatalf("present after an upload under a key: %v %v", ok, err)
	}
	if err := c.PutFiles(ctx, "nosuch", hash, bytes.NewReader(data)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("upload for an unknown template: %v", err)
	}
	if err := c.PutFiles(ctx, "py", hash, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.FilesPresent(tpl.ID, hash); !ok || err != nil {
		t.Fatalf("present after upload: %v %v", ok, err)
	}

	// A restart while b2 was building (as the worker records it).
	rec, err := c.Resolve(tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.Builds[b2].Status, rec.Status = template.BuildBuilding, template.BuildBuilding
	if err := st.Put(store.Templates, tpl.ID, rec); err != nil {
		t.Fatal(err)
	}
	// And a template with a ready snapshot whose rebuild was interrupted.
	ready, rb, err := c.CreateTemplate(template.Request{Name: "served"})
	if err != nil {
		t.Fatal(err)
	}
	ready.Snapshot, ready.BuildID, ready.Status, ready.DefaultUser = t.TempDir(), "earlier", template.BuildReady, "served-user"
	ready.Builds[rb].Status = template.BuildBuilding
	if err := st.Put(store.Templates, ready.ID, ready); err != nil {
		t.Fatal(err)
	}
	c.CloseBuilds()
	if _, _, err := c.CreateTemplate(template.Request{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("create after CloseBuilds: %v", err)
	}

	c = start()
	bs, err := c.BuildStatus("py", b2, 0, 100, "")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("status by name (ids only): %v", err)
	}
	bs, err = c.BuildStatus(tpl.ID, b2, 0, 100, "")
	if err != nil || bs.Status != template.BuildError || bs.Reason != "interrupted by node restart" || len(bs.Logs) != 1 ||
		bs.Logs[0].Level != "error" {
		t.Fatalf("after restart: %+v %v", bs, err)
	}
	if bs, _ := c.BuildStatus(tpl.ID, b2, 0, 100, "error"); len(bs.Logs) != 1 {
		t.Fatalf("level filter: %+v", bs.Logs)
	}
	if bs, _ := c.BuildStatus(tpl.ID, b2, 1, 100, ""); len(bs.Logs) != 0 {
		t.Fatalf("offset: %+v", bs.Logs)
	}
	if bs, _ := c.BuildStatus(tpl.ID, b2, 0, 0, ""); len(bs.Logs) != 0 || bs.Status != template.BuildError {
		t.Fatalf("limit 0: %+v", bs)
	}
	if bs, _ := c.BuildStatus(tpl.ID, b1, 0, 100, ""); bs.Status != template.BuildWaiting {
		t.Fatalf("the waiting build: %+v", bs)
	}
	if got, err := c.Resolve("py"); err != nil || got.ID != tpl.ID || got.Status != template.BuildError {
		t.Fatalf("resolve by name: %+v %v", got, err)
	}
	if _, err := c.Template("py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unbuilt template serves sandboxes: %v", err)
	}
	if got, err := c.Template("served"); err != nil || got.ID != ready.ID {
		t.Fatalf("a served template whose rebuild was interrupted: %+v %v", got, err)
	}
	if bs, _ := c.BuildStatus(ready.ID, rb, 0, 100, ""); bs.Status != template.BuildError {
		t.Fatalf("its interrupted rebuild: %+v", bs)
	}
	checkUsers(t, c, st, node, tpl.ID, ready.ID)
	if err := c.Delete(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(node.unpooled, tpl.ID) {
		t.Fatalf("the deleted template's VMM pool was not drained: %v", node.unpooled)
	}
	if _, err := c.Resolve(tpl.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := c.Delete(ctx, "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

// checkUsers: a template a sandbox (as its source or one of its drives) or
// a snapshot uses is not deleted, nor is the default template; a
// snapshot's sandboxes keep the user, lineage and boot files of the
// template it was taken from.
func checkUsers(t *testing.T, c *Catalog, st *store.Store, node *testNode, id, served string) {
	ctx := context.Background()
	users := []sandbox.Record{{ID: "s1", TemplateID: id, State: sandbox.Paused},
		{ID: "s2", TemplateID: served, State: sandbox.Running, Drives: []sandbox.AttachedDrive{{Drive: snapshot.Drive{Image: id}}}}}
	for _, r := range users {
		node.records = []sandbox.Record{r}
		if err := c.Delete(ctx, id); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("delete while sandbox %s uses it: %v", r.ID, err)
		}
	}
	node.records = nil
	snap := snapshot.Record{ID: "snap1", TemplateID: served}
	if err := st.Put(store.Snapshots, snap.ID, snap); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "served"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while a snapshot was taken from it: %v", err)
	}
	c.Set(&template.Template{ID: template.DefaultID, Dir: t.TempDir()})
	if err := c.Delete(ctx, template.DefaultID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of the default template: %v", err)
	}
	if u := c.DefaultUser(snap.ID); u != "served-user" {
		t.Fatalf("user of a snapshot's sandbox: %q", u)
	}
	if u := c.DefaultUser("nosuch"); u != "user" {
		t.Fatalf("user without a template: %q", u)
	}
	lineage := c.Lineage(snap.ID)
	if len(lineage) != 1 || lineage[0].ID != served {
		t.Fatalf("lineage of a snapshot: %+v", lineage)
	}
	if _, _, err := c.BootFiles(lineage); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("boot files where no template keeps a kernel: %v", err)
	}
	def, _ := c.ByID(template.DefaultID)
	for _, f := range []string{kernelFile, initrdFile} {
		if err := os.WriteFile(filepath.Join(def.Dir, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k, i, err := c.BootFiles(lineage)
	if err != nil || k != filepath.Join(def.Dir, kernelFile) || i != filepath.Join(def.Dir, initrdFile) {
		t.Fatalf("boot files fall back to the default template's: %q %q %v", k, i, err)
	}
}

// testNode is the node as the catalog sees it, without sandboxes of its
// own: those it lists are set by the test.
type testNode struct {
	records  []sandbox.Record
	unpooled []string
}

func (n *testNode) List() []sandbox.Record                                { return n.records }
func (n *testNode) ImportMemory(*template.Template) error                 { return nil }
func (n *testNode) Pool(*template.Template)                               {}
func (n *testNode) Unpool(_ context.Context, id string)                   { n.unpooled = append(n.unpooled, id) }
func (n *testNode) Published(context.Context, *template.Template)         {}
func (n *testNode) RestoreMemory(context.Context, string) (string, error) { return "", nil }
func (n *testNode) Localize(context.Context)                              {}
