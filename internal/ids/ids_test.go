package ids

import (
	"regexp"
	"testing"
)

func TestForms(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^[a-z0-9]{20}$`).MatchString(id) || seen[id] {
			t.Fatalf("id %q malformed or repeated", id)
		}
		seen[id] = true
	}
	u, err := UUID()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(u) {
		t.Fatalf("uuid %q is not version 4", u)
	}
	h, err := Hex(16)
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(h) {
		t.Fatalf("hex %q %v", h, err)
	}
}
