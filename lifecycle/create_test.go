package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// newborn is a registered sandbox nothing of which is written yet.
type newborn struct{ serving }

func (n *newborn) RecordNew() error {
	rec := n.rec
	rec.State = ""
	return n.j.Transition(rec, sandbox.Starting, nil, func(r sandbox.Record) { n.rec = r })
}

// TestCreateStages: a create whose VM comes up records "starting", then
// "running" until now+timeout, on the source's root disk, with the drives'
// blank layers in its directory; one whose bring-up fails is undone by
// Remove: its volumes go back, the node forgets it, its directory and
// record are gone.
func TestCreateStages(t *testing.T) {
	v, j, _ := setup(t)
	var published []string
	j.Publish = func(from sandbox.State, r sandbox.Record) {
		published = append(published, string(from)+">"+string(r.State))
	}
	rec := sandbox.Record{ID: "sb2", State: sandbox.Starting, Dir: filepath.Join(t.TempDir(), "sb2"),
		Drives: []sandbox.AttachedDrive{{Drive: snapshot.Drive{Slot: 1, SizeMiB: 1}}}}
	s := &newborn{serving{rec: rec, m: &machine{}, j: j}}
	var from string
	up := func(_ context.Context, f string, lap func(string)) error {
		from = f
		lap("vmm")
		return s.Update(func(r *sandbox.Record) { r.Gen++ })
	}
	c := Creation{From: "/templates/t1/snapshot", RootfsImage: "/templates/t1/rootfs.json", Timeout: time.Minute, Up: up}
	if err := v.Create(context.Background(), s, c); err != nil {
		t.Fatal(err)
	}
	got := stored(t, v.Store, rec.ID)
	if got.State != sandbox.Running || !got.EndAt.After(time.Now()) || got.RootfsImage != c.RootfsImage || got.Gen != 1 {
		t.Fatalf("created: %+v; want running until later on %s, generation 1", got, c.RootfsImage)
	}
	if from != c.From || strings.Join(published, ",") != ">starting,starting>running" {
		t.Fatalf("brought up from %q, published %v", from, published)
	}
	if cfg := got.Drives[0].Config; !strings.HasPrefix(cfg, rec.Dir+string(os.PathSeparator)) {
		t.Fatalf("drive config %q; want a blank layer in %s", cfg, rec.Dir)
	}

	failed := &newborn{serving{rec: sandbox.Record{ID: "sb3", State: sandbox.Starting, Dir: filepath.Join(t.TempDir(), "sb3")}, m: &machine{}, j: j}}
	boom := errors.New("restore failed")
	var order []string
	c.Up = func(context.Context, string, func(string)) error { return boom }
	c.Removal = Removal{
		Volumes: func(context.Context, sandbox.Record) { order = append(order, "volumes") },
		Forget:  func(sandbox.Record) { order = append(order, "forget") },
	}
	if err := v.Create(context.Background(), failed, c); !errors.Is(err, boom) {
		t.Fatalf("Create = %v; want the bring-up's error", err)
	}
	if !failed.stopped || strings.Join(order, ",") != "volumes,forget" {
		t.Fatalf("after a failed create: VM stopped %v, removal %v", failed.stopped, order)
	}
	if _, err := os.Stat(failed.rec.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed create left its directory (stat: %v)", err)
	}
	var r sandbox.Record
	if err := v.Store.Get(store.Sandboxes, "sb3", &r); err == nil {
		t.Fatalf("a failed create left its record: %+v", r)
	}
}
