package guestassets

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBuildAgentReusesOneFile: two builds of the same source give the same
// content-named file, and no temporary copies stay behind.
func TestBuildAgentReusesOneFile(t *testing.T) {
	startTime := time.Now()
	ctx := context.Background()
	a, err := BuildAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuildAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("two builds of one source: %s and %s", a, b)
	}
	if st, err := os.Stat(a); err != nil || st.Size() == 0 {
		t.Fatalf("agent binary %s: %v", a, err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(a), "build-*"))
	for _, p := range left {
		if st, err := os.Stat(p); err == nil && st.ModTime().After(startTime) {
			t.Fatalf("temporary build file left: %s", p)
		}
	}
}
