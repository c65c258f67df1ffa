package disk

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
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
		if err := CheckDrives(reqs); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want errdefs.ErrInvalid", name, err)
		}
	}
}

// TestPlanDrives: a create's drives go into the free slots after those its
// snapshot carries; more drives than free slots and an image without a
// layered root disk are refused.
func TestPlanDrives(t *testing.T) {
	known := map[string]*template.Template{
		"img":  {ID: "img", RootfsImage: "/data/templates/img/rootfs.json"},
		"flat": {ID: "flat"},
	}
	source := func(id string) (*template.Template, error) {
		if t, ok := known[id]; ok {
			return t, nil
		}
		return nil, errdefs.ErrNotFound
	}
	tpl := &template.Template{ID: "base", DriveSlots: 4}
	got, err := PlanDrives(tpl, []DriveRequest{{Image: "img", ReadOnly: true}, {SizeMiB: 8}}, source)
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
	got, err = PlanDrives(snap, []DriveRequest{{SizeMiB: 16}}, source)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Slot != 1 || got[0].Fresh || got[0].Config != "/s/drive1.json" || got[1].Slot != 2 || !got[1].Fresh {
		t.Fatalf("planned from a snapshot with a drive: %+v", got)
	}
	if got, err := PlanDrives(snap, nil, source); err != nil || len(got) != 1 {
		t.Fatalf("no new drives: %+v %v", got, err)
	}
	for name, c := range map[string]struct {
		t    *template.Template
		reqs []DriveRequest
	}{
		"no slots":      {&template.Template{ID: "old"}, []DriveRequest{{SizeMiB: 8}}},
		"too few slots": {snap, []DriveRequest{{SizeMiB: 8}, {SizeMiB: 8}, {SizeMiB: 8}, {SizeMiB: 8}}},
		"flat image":    {tpl, []DriveRequest{{Image: "flat"}}},
	} {
		if _, err := PlanDrives(c.t, c.reqs, source); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want errdefs.ErrInvalid", name, err)
		}
	}
}
