package orchestrator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"github.com/agentenv/agentenv/disk/disktest"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// TestBuildStateSurvivesRestart: without VMs, the build bookkeeping of a
// node: create (and re-create by name), uploads checked by SHA-256, a build
// a restart interrupted marked failed with its reason and log, deletion.
func TestBuildStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	devices := disktest.Devices(t)
	start := func() *Orchestrator {
		o, err := New(ctx, Options{DataDir: dir, Store: st, Storage: devices, VCPUs: 1, MemoryMiB: 256})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.EnableBuilds(ctx, template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.CloseBuilds)
		return o
	}
	o := start()
	tpl, b1, err := o.CreateTemplate(template.Request{Name: "py", Tags: []string{"v1"}})
	if err != nil || tpl.Status != template.BuildWaiting || tpl.VCPUs != 1 || tpl.MemoryMiB != 256 {
		t.Fatalf("create: %+v %v", tpl, err)
	}
	again, b2, err := o.CreateTemplate(template.Request{Name: "py", VCPUs: 2, MemoryMiB: 512})
	if err != nil || again.ID != tpl.ID || b2 == b1 || again.VCPUs != 2 {
		t.Fatalf("re-create by name: %+v %s %v", again, b2, err)
	}
	for _, bad := range []template.Request{{Name: "../x"}, {Name: "ok", MemoryMiB: 64}, {Name: "ok", VCPUs: 1000}} {
		if _, _, err := o.CreateTemplate(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("create %+v: %v", bad, err)
		}
	}
	if err := o.StartBuild(tpl.ID, b1, template.BuildSpec{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("build of a spec naming no base image: %v", err)
	}

	data := []byte("archive bytes")
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if ok, err := o.TemplateFilesPresent(tpl.ID, hash); ok || err != nil {
		t.Fatalf("present before upload: %v %v", ok, err)
	}
	if err := o.PutTemplateFiles(ctx, tpl.ID, hash, bytes.NewReader([]byte("other bytes"))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("mismatching upload: %v", err)
	}
	if err := o.PutTemplateFiles(ctx, "nosuch", hash, bytes.NewReader(data)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("upload for an unknown template: %v", err)
	}
	if err := o.PutTemplateFiles(ctx, "py", hash, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.TemplateFilesPresent(tpl.ID, hash); !ok || err != nil {
		t.Fatalf("present after upload: %v %v", ok, err)
	}

	// A restart while b2 was building (as the worker records it).
	rec, err := o.ResolveTemplate(tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.Builds[b2].Status, rec.Status = template.BuildBuilding, template.BuildBuilding
	if err := st.Put(store.Templates, tpl.ID, rec); err != nil {
		t.Fatal(err)
	}
	// And a template with a ready snapshot whose rebuild was interrupted.
	ready, rb, err := o.CreateTemplate(template.Request{Name: "served"})
	if err != nil {
		t.Fatal(err)
	}
	ready.Snapshot, ready.BuildID, ready.Status = t.TempDir(), "earlier", template.BuildReady
	ready.Builds[rb].Status = template.BuildBuilding
	if err := st.Put(store.Templates, ready.ID, ready); err != nil {
		t.Fatal(err)
	}
	o.CloseBuilds()
	if _, _, err := o.CreateTemplate(template.Request{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create after CloseBuilds: %v", err)
	}

	o = start()
	bs, err := o.BuildStatusOf("py", b2, 0, 100, "")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("status by name (ids only): %v", err)
	}
	bs, err = o.BuildStatusOf(tpl.ID, b2, 0, 100, "")
	if err != nil || bs.Status != template.BuildError || bs.Reason != "interrupted by node restart" || len(bs.Logs) != 1 ||
		bs.Logs[0].Level != "error" {
		t.Fatalf("after restart: %+v %v", bs, err)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 0, 100, "error"); len(bs.Logs) != 1 {
		t.Fatalf("level filter: %+v", bs.Logs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 1, 100, ""); len(bs.Logs) != 0 {
		t.Fatalf("offset: %+v", bs.Logs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 0, 0, ""); len(bs.Logs) != 0 || bs.Status != template.BuildError {
		t.Fatalf("limit 0: %+v", bs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b1, 0, 100, ""); bs.Status != template.BuildWaiting {
		t.Fatalf("the waiting build: %+v", bs)
	}
	if got, err := o.ResolveTemplate("py"); err != nil || got.ID != tpl.ID || got.Status != template.BuildError {
		t.Fatalf("resolve by name: %+v %v", got, err)
	}
	if _, err := o.Template("py"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unbuilt template serves sandboxes: %v", err)
	}
	if got, err := o.Template("served"); err != nil || got.ID != ready.ID {
		t.Fatalf("a served template whose rebuild was interrupted: %+v %v", got, err)
	}
	if bs, _ := o.BuildStatusOf(ready.ID, rb, 0, 100, ""); bs.Status != template.BuildError {
		t.Fatalf("its interrupted rebuild: %+v", bs)
	}
	if err := o.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.ResolveTemplate(tpl.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := o.DeleteTemplate(ctx, "py"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
