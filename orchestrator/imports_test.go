package orchestrator

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// storageOnlyDisk are the storage packages only package disk may speak
// for the node: the storage daemon's RPC types and client, and the layered
// image format.
var storageOnlyDisk = []string{"storage/daemon", "storage/image"}

// TestNoStorageImports: no file of the orchestrator imports the storage
// daemon's packages or storage/image; the node reaches its disks through
// package disk.
func TestNoStorageImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("list the package's files: %v (%d found)", err, len(files))
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			rel, ok := strings.CutPrefix(path, "github.com/agentenv/agentenv/")
			if !ok {
				continue
			}
			for _, p := range storageOnlyDisk {
				if rel == p || strings.HasPrefix(rel, p+"/") {
					t.Errorf("%s imports %s: the orchestrator reaches disks through package disk", name, path)
				}
			}
		}
	}
}
