package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRealRun runs `go test -json` on a small package with a passing, a
// skipped and a failing test, and checks what testsum prints of it.
func TestRealRun(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/sample\n\ngo 1.22\n",
		"s_test.go": `package sample

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet pass") }
func TestSkips(t *testing.T)  { t.Skip("redis-server is not installed") }
func TestFails(t *testing.T)  { t.Fatal("broken on purpose") }
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	events, _ := cmd.Output() // exits 1: TestFails fails
	var out bytes.Buffer
	s := newSummary(&out, false)
	if err := s.read(bytes.NewReader(events)); err != nil {
		t.Fatal(err)
	}
	s.report(&out, "sample", true)
	got := out.String()
	for _, want := range []string{"--- FAIL: TestFails", "broken on purpose", "FAIL\texample.com/sample",
		"== skipped tests (sample): 1", "SKIP example.com/sample TestSkips: s_test.go:6: redis-server is not installed"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"quiet pass", "=== RUN"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q, which plain go test does not print:\n%s", unwanted, got)
		}
	}
	if !s.failed {
		t.Error("a failed test did not mark the run failed")
	}
}
