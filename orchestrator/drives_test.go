package orchestrator

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
)

func TestCheckDrives(t *testing.T) {
	ok := [][]DriveRequest{
		nil,
		{{Image: "base", ReadOnly: true}, {SizeMiB: 64}},
		{{Image: "base"}, {SizeMiB: 1}, {SizeMiB: MaxDriveMiB}, {Image: "my-template.v2"}},
	}
	for _, reqs := range ok {
		if err := CheckDrives(reqs); err != nil {
			t.Errorf("%+v: %v", reqs, err)
		}
	}
	bad := map[string][]DriveRequest{
		"too many":              {{SizeMiB: 1}, {SizeMiB: 1}, {SizeMiB: 1}, {SizeMiB: 1}, {SizeMiB: 1}},
		"neither":               {{}},
		"both":                  {{Image: "base", SizeMiB: 8}},
		"zero size read-only":   {{ReadOnly: true}},
		"negative size":         {{SizeMiB: -1}},
		"too large":             {{SizeMiB: MaxDriveMiB + 1}},
		"read-only blank":       {{SizeMiB: 8, ReadOnly: true}},
		"path as image":         {{Image: "../base"}},
		"slash in image":        {{Image: "a/b"}},
		"image name too long":   {{Image: strings.Repeat("a", 129)}},
		"leading dot in image":  {{Image: ".base"}},
		"space in image":        {{Image: "my template"}},
		"second of two is bad":  {{SizeMiB: 8}, {SizeMiB: 0}},
		"image with nul":        {{Image: "base\x00"}},
		"image of only a slash": {{Image: "/"}},
	}
	for name, reqs := range bad {
		if err := CheckDrives(reqs); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestPlanDrives: a create's drives go into the free slots after those its
// snapshot carries; more drives than free slots and an image without a
// layered root disk are refused.
func TestPlanDrives(t *testing.T) {
	o := &Orchestrator{}
	o.catalog = o.newCatalog()
	o.catalog.Set(&template.Template{ID: "img", RootfsImage: "/data/templates/img/rootfs.json"})
	o.catalog.Set(&template.Template{ID: "flat"})
	tpl := &template.Template{ID: "base", DriveSlots: 4}
	got, err := o.planDrives(tpl, []DriveRequest{{Image: "img", ReadOnly: true}, {SizeMiB: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Slot != 1 || got[0].Config != "/data/templates/img/rootfs.json" || !got[0].ReadOnly || !got[0].Fresh ||
		got[1].Slot != 2 || got[1].Config != "" || got[1].SizeMiB != 8 || !got[1].Fresh {
		t.Fatalf("planned %+v", got)
	}
	// A snapshot with a drive in slot 1: its drive carries over (not fresh),
	// new ones take the next slots.
	snap := &template.Template{ID: "snap", DriveSlots: 4, Drives: []snapshot.Drive{{Slot: 1, SizeMiB: 8, Config: "/s/drive1.json"}}}
	got, err = o.planDrives(snap, []DriveRequest{{SizeMiB: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Slot != 1 || got[0].Fresh || got[0].Config != "/s/drive1.json" || got[1].Slot != 2 || !got[1].Fresh {
		t.Fatalf("planned from a snapshot with a drive: %+v", got)
	}
	if got, err := o.planDrives(snap, nil); err != nil || len(got) != 1 {
		t.Fatalf("no new drives: %+v %v", got, err)
	}
	for name, c := range map[string]struct {
		o    *Orchestrator
		t    *template.Template
		reqs []DriveRequest
	}{
		"no slots":      {o, &template.Template{ID: "old"}, []DriveRequest{{SizeMiB: 8}}},
		"too few slots": {o, snap, []DriveRequest{{SizeMiB: 8}, {SizeMiB: 8}, {SizeMiB: 8}, {SizeMiB: 8}}},
		"flat image":    {o, tpl, []DriveRequest{{Image: "flat"}}},
	} {
		if _, err := c.o.planDrives(c.t, c.reqs); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestRecordDevices: a record's devices are its root disk's and its
// drives', and clearDevices forgets them all.
func TestRecordDevices(t *testing.T) {
	r := sandbox.Record{Device: 7, HasDevice: true, Drives: []sandbox.AttachedDrive{{Device: 8, HasDevice: true}, {}, {Device: 9, HasDevice: true}}}
	if got := r.Devices(); len(got) != 3 || got[0] != 7 || got[1] != 8 || got[2] != 9 {
		t.Fatalf("devices %v", got)
	}
	r.ClearDevices()
	if got := r.Devices(); len(got) != 0 || r.Drives[2].Device != 0 {
		t.Fatalf("after clearDevices: %v %+v", got, r)
	}
}
