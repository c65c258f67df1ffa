package catalog

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/disk/disktest"
	"github.com/agentenv/agentenv/guest/codeinterp"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// Without VMs: code-interpreter-v1 is listed once builds are enabled, with
// its build waiting; a create naming it starts that build and
// waits for it; a build whose root filesystem cannot be made (no Debian
// mirror) fails with that reason, the template is listed with its failed
// build, and the next use tries again. Other names are left alone.
func TestBuiltinBuildsOnFirstUse(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	disks, err := disk.New(ctx, disk.Options{Devices: disktest.Devices(t), Backend: "local"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disks.Close)
	c := New(Config{DataDir: dir, Store: st, VCPUs: 1, MemoryMiB: 256, DefaultUser: "user", Disks: disks, Node: &testNode{},
		Refs: &sync.Mutex{}})
	var calls atomic.Int32
	rootfs := func(_ context.Context, variant string) (string, error) {
		calls.Add(1)
		if variant != codeinterp.TemplateName {
			t.Errorf("variant %q asked for", variant)
		}
		return "", errors.New("apt-get update: could not resolve deb.debian.org")
	}
	if err := c.EnsureBuiltin(ctx, codeinterp.TemplateName); err != nil {
		t.Fatalf("without builds enabled: %v", err)
	}
	if err := c.EnableBuilds(ctx, template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}, Rootfs: rootfs}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseBuilds)
	if err := c.EnsureBuiltin(ctx, "base"); err != nil || calls.Load() != 0 {
		t.Fatalf("another name: %v (%d builds)", err, calls.Load())
	}
	listed, err := c.Resolve(codeinterp.TemplateName)
	if err != nil || listed.Status != template.BuildWaiting || calls.Load() != 0 {
		t.Fatalf("before its first use: %+v %v (%d builds): want it listed, waiting, unbuilt", listed, err, calls.Load())
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = c.EnsureBuiltin(wctx, codeinterp.TemplateName)
	if err == nil || !strings.Contains(err.Error(), "could not resolve deb.debian.org") || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("first use with no mirror: %v", err)
	}
	tpl, err := c.Resolve(codeinterp.TemplateName)
	if err != nil || tpl.Status != template.BuildError || tpl.MemoryMiB < 1024 || tpl.ID != listed.ID || len(tpl.Builds) != 1 {
		t.Fatalf("listed after the failed build: %+v %v", tpl, err)
	}
	bs, err := c.BuildStatus(tpl.ID, tpl.LatestBuild, 0, -1, "")
	if err != nil || bs.ReasonStep != template.StepBase || !strings.Contains(bs.Reason, "root filesystem variant "+codeinterp.TemplateName) {
		t.Fatalf("the failed build's status: %+v %v", bs, err)
	}
	if err := c.EnsureBuiltin(wctx, codeinterp.TemplateName); err == nil || calls.Load() != 2 {
		t.Fatalf("the next use does not build again: %v (%d builds)", err, calls.Load())
	}
	if again, _ := c.Resolve(codeinterp.TemplateName); again.ID != tpl.ID || len(again.Builds) != 2 {
		t.Fatalf("the retry is not a new build of the same template: %+v", again)
	}
}
