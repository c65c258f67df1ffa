package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/vmm"
)

// TestRefusesHoles: a plain file a restored machine would map privately
// takes hole punches, so a shrink is refused (vmm.ErrUnsupported) and the
// probe leaves the file's bytes and size as they were; a device is refused
// without a probe.
func TestRefusesHoles(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "mem")
	data := bytes.Repeat([]byte{0xa5}, 3*pageSize+100)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := refusesHoles(path); !errors.Is(err, vmm.ErrUnsupported) {
		t.Fatalf("plain file: %v, want vmm.ErrUnsupported", err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the probe changed the file: %d bytes, %v", len(got), err)
	}
	if err := refusesHoles("/dev/null"); !errors.Is(err, vmm.ErrUnsupported) {
		t.Fatalf("device: %v, want vmm.ErrUnsupported", err)
	}
}
