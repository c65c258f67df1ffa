package image

import (
	"os"
	"path/filepath"
	"testing"
)

// A variant's cache key follows everything it is built from: another
// package, another file (content or mode), another base tree or agent
// builds another variant; the same inputs in another order find the same.
func TestVariantKeyFollowsInputs(t *testing.T) {
	v := Variant{Name: "v", Packages: []string{"a", "b"}, Files: map[string]File{"/x": {Data: []byte("1"), Mode: 0o644}}}
	key := variantKey("base", "agent", "k.deb", v, 4096)
	same := Variant{Name: "v", Packages: []string{"b", "a"}, Files: map[string]File{"/x": {Data: []byte("1"), Mode: 0o644}}}
	if k := variantKey("base", "agent", "k.deb", same, 4096); k != key {
		t.Fatalf("same inputs, keys %s and %s", key, k)
	}
	others := map[string]string{
		"package":   variantKey("base", "agent", "k.deb", Variant{Name: "v", Packages: []string{"a"}, Files: v.Files}, 4096),
		"file data": variantKey("base", "agent", "k.deb", Variant{Name: "v", Packages: v.Packages, Files: map[string]File{"/x": {Data: []byte("2"), Mode: 0o644}}}, 4096),
		"file mode": variantKey("base", "agent", "k.deb", Variant{Name: "v", Packages: v.Packages, Files: map[string]File{"/x": {Data: []byte("1"), Mode: 0o755}}}, 4096),
		"file name": variantKey("base", "agent", "k.deb", Variant{Name: "v", Packages: v.Packages, Files: map[string]File{"/y": {Data: []byte("1"), Mode: 0o644}}}, 4096),
		"base tree": variantKey("other", "agent", "k.deb", v, 4096),
		"agent":     variantKey("base", "other", "k.deb", v, 4096),
		"size":      variantKey("base", "agent", "k.deb", v, 2048),
		"modules":   variantKey("base", "agent", "k.deb", Variant{Name: "v", Packages: v.Packages, Files: v.Files, Modules: []string{"veth"}}, 4096),
		"kernel":    variantKey("base", "agent", "k2.deb", Variant{Name: "v", Packages: v.Packages, Files: v.Files, Modules: []string{"veth"}}, 4096),
		"name":      variantKey("base", "agent", "k.deb", Variant{Name: "w", Packages: v.Packages, Files: v.Files}, 4096),
	}
	for what, k := range others {
		if k == key {
			t.Errorf("another %s gives the same key %s", what, k)
		}
	}
	if others["kernel"] == others["modules"] {
		t.Errorf("the same modules of another kernel give the same key %s", others["kernel"])
	}
}

// writeFiles keeps every file inside the tree, whatever its path says.
func TestWriteFilesStaysInTree(t *testing.T) {
	tree := t.TempDir()
	if err := writeFiles(tree, map[string]File{"../../escape": {Data: []byte("x"), Mode: 0o600}, "/usr/lib/s.py": {Data: []byte("y"), Mode: 0o755}}); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]uint32{"escape": 0o600, "usr/lib/s.py": 0o755} {
		st, err := os.Stat(filepath.Join(tree, p))
		if err != nil {
			t.Fatalf("%s not in the tree: %v", p, err)
		}
		if uint32(st.Mode().Perm()) != mode {
			t.Errorf("%s mode %o, want %o", p, st.Mode().Perm(), mode)
		}
	}
}
