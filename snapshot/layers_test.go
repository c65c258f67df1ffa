package snapshot

import (
	"path/filepath"
	"reflect"
	"testing"
)

func TestImageConfigRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rootfs-2.json")
	layers := []string{filepath.Join(dir, "rootfs-0.lsmt"), "/abs/elsewhere/rootfs-1.lsmt"}
	if err := WriteImageConfig(path, layers); err != nil {
		t.Fatal(err)
	}
	got, err := LayersOf(path)
	if err != nil || !reflect.DeepEqual(got, layers) {
		t.Fatalf("LayersOf = %v, %v; want %v", got, err, layers)
	}
	if _, err := LayersOf(filepath.Join(dir, "missing.json")); err == nil {
		t.Fatal("LayersOf of a missing config succeeded")
	}
	if Refs("") != nil || Refs(filepath.Join(dir, "missing.json")) != nil {
		t.Fatal("Refs of no config lists layers")
	}
}
