package image

import (
	"slices"
	"testing"
)

// The cache key of the debootstrap tree follows its inputs: another package
// list (or suite, or mirror) must build another tree, never reuse the old
// one, and the same inputs must find the same tree.
func TestBaseTreeKeyFollowsInputs(t *testing.T) {
	base := Options{Suite: DefaultSuite, Mirror: DefaultMirror, Packages: DefaultPackages}
	key := baseTreeKey(base)
	if again := baseTreeKey(Options{Suite: DefaultSuite, Mirror: DefaultMirror, Packages: slices.Clone(DefaultPackages)}); again != key {
		t.Fatalf("same inputs, keys %s and %s", key, again)
	}
	variants := map[string]Options{
		"fewer packages": {Suite: DefaultSuite, Mirror: DefaultMirror, Packages: DefaultPackages[:len(DefaultPackages)-1]},
		"more packages":  {Suite: DefaultSuite, Mirror: DefaultMirror, Packages: append(slices.Clone(DefaultPackages), "vim")},
		"suite":          {Suite: "trixie", Mirror: DefaultMirror, Packages: DefaultPackages},
		"mirror":         {Suite: DefaultSuite, Mirror: "http://mirror.example/debian", Packages: DefaultPackages},
	}
	for name, o := range variants {
		if k := baseTreeKey(o); k == key {
			t.Errorf("%s: key %s is the default tree's", name, k)
		}
	}
}

// The default package list carries what users of E2B's base image rely on.
func TestDefaultPackagesCarryTheBaseImage(t *testing.T) {
	for _, p := range []string{"git", "curl", "python3", "python3-pip", "python3-venv", "nodejs", "npm", "sudo", "procps", "build-essential"} {
		if !slices.Contains(DefaultPackages, p) {
			t.Errorf("DefaultPackages lacks %s: %v", p, DefaultPackages)
		}
	}
	var o Options
	o.Agent = "/proc/self/exe"
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Packages, DefaultPackages) {
		t.Fatalf("defaults() packages %v, want %v", o.Packages, DefaultPackages)
	}
}
