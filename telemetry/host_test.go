package telemetry

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMappedImagesCountsSharedFilesOnce(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(dir, "c")
	if err := os.WriteFile(c, []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	images, vms := MappedImages([]string{a, b, c, "", filepath.Join(dir, "missing")})
	if images != 2 || vms != 3 {
		t.Fatalf("MappedImages = %d images, %d VMs; want 2, 3", images, vms)
	}
}

func TestSampleHostReadsProc(t *testing.T) {
	h := SampleHost(t.TempDir())
	if h.CPUCount < 1 || h.MemTotalMiB <= 0 || h.DiskTotalMiB <= 0 {
		t.Fatalf("SampleHost = %+v; want CPUs, memory and disk", h)
	}
}
