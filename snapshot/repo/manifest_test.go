package repo

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func sample() *Manifest {
	d := func(s string) Blob { return Blob{Digest: DigestOf([]byte(s)), Size: int64(len(s))} }
	return &Manifest{Schema: SchemaVersion, Name: "snap-1", Kind: KindSnapshot, Parent: "base",
		Created: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
		Rootfs:  []Layer{{Blob: d("r0"), Chunks: d("c0")}},
		Memory:  []Layer{{Blob: d("m0"), Chunks: d("c1")}},
		State:   d("state"), Config: d("config")}
}

func TestManifestRoundTrip(t *testing.T) {
	m := sample()
	data, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseManifest(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := got.Encode()
	if string(again) != string(data) {
		t.Fatalf("round trip changed the manifest:\n%s\n%s", data, again)
	}
	if n := len(m.Blobs()); n != 6 {
		t.Fatalf("blobs = %d, want 6", n)
	}
	ws := Blob{Digest: DigestOf([]byte("ws")), Size: 2}
	m.WorkingSet = &ws
	data, err = m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err = ParseManifest(data); err != nil || got.WorkingSet == nil || *got.WorkingSet != ws {
		t.Fatalf("a manifest with a working set parsed as %+v, %v", got, err)
	}
	if n := len(m.Blobs()); n != 7 {
		t.Fatalf("blobs with a working set = %d, want 7 (the collector keeps what Blobs lists)", n)
	}
}

func TestManifestRejects(t *testing.T) {
	cases := map[string]func(m *Manifest){
		"schema":        func(m *Manifest) { m.Schema = 2 },
		"name":          func(m *Manifest) { m.Name = "a/b" },
		"dot name":      func(m *Manifest) { m.Name = ".hidden" },
		"long name":     func(m *Manifest) { m.Name = strings.Repeat("a", MaxNameLen+1) },
		"parent":        func(m *Manifest) { m.Parent = "../up" },
		"kind":          func(m *Manifest) { m.Kind = "vm" },
		"created":       func(m *Manifest) { m.Created = time.Time{} },
		"no rootfs":     func(m *Manifest) { m.Rootfs = nil },
		"too many":      func(m *Manifest) { m.Memory = make([]Layer, MaxLayers) },
		"digest":        func(m *Manifest) { m.Rootfs[0].Digest = "sha256:abc" },
		"upper hex":     func(m *Manifest) { m.State.Digest = Digest(strings.ToUpper(string(m.State.Digest))) },
		"negative size": func(m *Manifest) { m.Config.Size = -1 },
		"chunks":        func(m *Manifest) { m.Memory[0].Chunks.Digest = "md5:x" },
		"ws digest":     func(m *Manifest) { m.WorkingSet = &Blob{Digest: "sha256:0", Size: 1} },
		"ws size":       func(m *Manifest) { m.WorkingSet = &Blob{Digest: m.State.Digest, Size: MaxWorkingSetPack + 1} },
		"ws no memory":  func(m *Manifest) { m.WorkingSet, m.Memory = &m.State, nil },
	}
	for name, mutate := range cases {
		m := sample()
		mutate(m)
		if _, err := m.Encode(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: encode gave %v, want ErrInvalid", name, err)
		}
	}
	for _, s := range []string{``, `{}`, `[]`, `{"schema":1,"bogus":1}`, `null`} {
		if _, err := ParseManifest([]byte(s)); !errors.Is(err, ErrInvalid) {
			t.Errorf("parse %q: %v, want ErrInvalid", s, err)
		}
	}
}

// FuzzParseManifest: bytes from the store either parse into a manifest that
// validates and encodes back to an equivalent manifest, or give ErrInvalid;
// never a panic.
func FuzzParseManifest(f *testing.F) {
	data, _ := sample().Encode()
	f.Add(data)
	f.Add([]byte(`{"schema":1,"name":"x","kind":"template","created":"2026-01-01T00:00:00Z","rootfs":[]}`))
	f.Add([]byte(`{"schema":1,"rootfs":[{"digest":"sha256:` + strings.Repeat("0", 64) + `","size":-5}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		enc, err := m.Encode()
		if err != nil {
			t.Fatalf("a parsed manifest does not encode: %v", err)
		}
		if _, err := ParseManifest(enc); err != nil {
			t.Fatalf("re-encoded manifest does not parse: %v", err)
		}
	})
}
