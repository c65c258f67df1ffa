package repo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Limits on what a manifest read from the store may hold: it is untrusted
// input, and a node must not allocate beyond them.
const (
	MaxManifestSize = 1 << 20
	MaxLayers       = 256
	MaxNameLen      = 128
	// SchemaVersion is the manifest format this package writes and reads.
	SchemaVersion = 1
)

// Blob describes a stored blob: its digest and size.
type Blob struct {
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
}

// Layer is a sealed layer file and the chunk digest table its remote reads
// are verified against (a blob too, package storage/blob's format).
type Layer struct {
	Blob
	Chunks Blob `json:"chunks"`
}

// Manifest is a committed snapshot or template: which blobs make it, bottom
// to top. It is the only mutable-looking thing in the repository and it is
// written last, after every blob it names.
type Manifest struct {
	Schema  int       `json:"schema"`
	Name    string    `json:"name"`
	Kind    string    `json:"kind"`             // "snapshot" or "template"
	Parent  string    `json:"parent,omitempty"` // the manifest this one was taken from
	Created time.Time `json:"created"`
	Rootfs  []Layer   `json:"rootfs"` // bottom to top
	Memory  []Layer   `json:"memory"` // bottom to top
	State   Blob      `json:"state"`  // the VMM's device state
	Config  Blob      `json:"config"` // the VM's configuration (vCPUs, memory, disk geometry)
	// WorkingSet, when set, is the pack of the memory stack's working set
	// (package memsnap's format, opaque here): the bytes of the pages a
	// restore touches first, read in one piece by a node that reads the
	// stack's layers lazily. Committed with the layers, so vouched for
	// like them.
	WorkingSet *Blob `json:"workingSet,omitempty"`
}

// MaxWorkingSetPack bounds a manifest's working-set pack (memsnap bounds
// its contents more tightly).
const MaxWorkingSetPack = 128 << 20

// Kinds of manifest.
const (
	KindSnapshot = "snapshot"
	KindTemplate = "template"
)

// What a node reads a layer for: a Manifest's Rootfs or Memory (a node's
// lazy reads are counted apart by use).
const (
	UseRootfs = "rootfs"
	UseMemory = "memory"
)

// Blobs lists every blob m references (layers, their chunk tables, state
// and config), without duplicates.
func (m *Manifest) Blobs() []Blob {
	var out []Blob
	seen := map[Digest]bool{}
	add := func(b Blob) {
		if !seen[b.Digest] {
			seen[b.Digest] = true
			out = append(out, b)
		}
	}
	for _, l := range slices.Concat(m.Rootfs, m.Memory) {
		add(l.Blob)
		add(l.Chunks)
	}
	add(m.State)
	add(m.Config)
	if m.WorkingSet != nil {
		add(*m.WorkingSet)
	}
	return out
}

// Size is the sum of the sizes of the distinct blobs m references.
func (m *Manifest) Size() int64 {
	var n int64
	for _, b := range m.Blobs() {
		n += b.Size
	}
	return n
}

// ValidName checks a manifest name: 1 to 128 of [A-Za-z0-9._-], not starting
// with a dot (names become object keys and file names).
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameLen || name[0] == '.' {
		return fmt.Errorf("manifest name %.140q: %w (1-%d characters, not starting with '.')", name, ErrInvalid, MaxNameLen)
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("manifest name %q: %w (only A-Z a-z 0-9 . _ -)", name, ErrInvalid)
		}
	}
	return nil
}

// Validate checks everything a reader of m relies on.
func (m *Manifest) Validate() error {
	if m.Schema != SchemaVersion {
		return fmt.Errorf("manifest schema %d: %w (this node reads %d)", m.Schema, ErrInvalid, SchemaVersion)
	}
	if err := ValidName(m.Name); err != nil {
		return err
	}
	if m.Parent != "" {
		if err := ValidName(m.Parent); err != nil {
			return fmt.Errorf("parent: %w", err)
		}
	}
	if m.Kind != KindSnapshot && m.Kind != KindTemplate {
		return fmt.Errorf("manifest %s: kind %.20q: %w", m.Name, m.Kind, ErrInvalid)
	}
	if m.Created.IsZero() {
		return fmt.Errorf("manifest %s: no created time: %w", m.Name, ErrInvalid)
	}
	if len(m.Rootfs) == 0 || len(m.Rootfs)+len(m.Memory) > MaxLayers {
		return fmt.Errorf("manifest %s: %d rootfs and %d memory layers: %w (at least one rootfs layer, at most %d in all)",
			m.Name, len(m.Rootfs), len(m.Memory), ErrInvalid, MaxLayers)
	}
	for i, l := range slices.Concat(m.Rootfs, m.Memory) {
		if err := validBlob(l.Blob); err != nil {
			return fmt.Errorf("manifest %s: layer %d: %w", m.Name, i, err)
		}
		if err := validBlob(l.Chunks); err != nil {
			return fmt.Errorf("manifest %s: layer %d chunk table: %w", m.Name, i, err)
		}
	}
	if err := validBlob(m.State); err != nil {
		return fmt.Errorf("manifest %s: state: %w", m.Name, err)
	}
	if err := validBlob(m.Config); err != nil {
		return fmt.Errorf("manifest %s: config: %w", m.Name, err)
	}
	return m.validWorkingSet()
}

// validWorkingSet checks the working-set pack, if any: bounded, and of a
// manifest with memory layers.
func (m *Manifest) validWorkingSet() error {
	if m.WorkingSet == nil {
		return nil
	}
	if err := validBlob(*m.WorkingSet); err != nil {
		return fmt.Errorf("manifest %s: working set: %w", m.Name, err)
	}
	if len(m.Memory) == 0 || m.WorkingSet.Size > MaxWorkingSetPack {
		return fmt.Errorf("manifest %s: a working set of %d bytes for %d memory layers: %w (at most %d bytes, of a stack)",
			m.Name, m.WorkingSet.Size, len(m.Memory), ErrInvalid, MaxWorkingSetPack)
	}
	return nil
}

func validBlob(b Blob) error {
	if err := b.Digest.Validate(); err != nil {
		return err
	}
	if b.Size < 0 {
		return fmt.Errorf("blob %s: negative size %d: %w", b.Digest, b.Size, ErrInvalid)
	}
	return nil
}

// Encode returns m's canonical JSON (what Commit stores).
func (m *Manifest) Encode() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	c := *m
	c.Created = c.Created.UTC()
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("encode manifest %s: %w", m.Name, err)
	}
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("manifest %s encodes to %d bytes, more than %d: %w", m.Name, len(data), MaxManifestSize, ErrInvalid)
	}
	return data, nil
}

// ParseManifest decodes and validates a manifest read from the store:
// bounded in size, no unknown fields, nothing after the document.
func ParseManifest(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("parse manifest: %d bytes, more than %d: %w", len(data), MaxManifestSize, ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("parse manifest: %w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("parse manifest: data after the document: %w", ErrInvalid)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	return &m, nil
}

func sortStrings(s []string) { slices.Sort(s) }
