package variants

import (
	"slices"
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	names := Names()
	if !slices.IsSorted(names) || !slices.Contains(names, "code-interpreter-v1") || !slices.Contains(names, "compose-v1") {
		t.Fatalf("Names() = %v", names)
	}
	for _, n := range names {
		v, err := Lookup(n)
		if err != nil || v.Name != n || len(v.Packages) == 0 {
			t.Errorf("Lookup(%q) = %+v, %v", n, v, err)
		}
	}
	c, _ := Lookup("compose-v1")
	if !slices.Contains(c.Packages, "kmod") || !slices.Contains(c.Modules, "br_netfilter") {
		t.Errorf("compose-v1 lacks kmod or Docker's modules: %+v", c)
	}
	if _, err := Lookup("nope"); err == nil || !strings.Contains(err.Error(), "compose-v1") {
		t.Fatalf("Lookup of an unknown variant: %v", err)
	}
}
