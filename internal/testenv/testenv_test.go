package testenv

import (
	"fmt"
	"runtime"
	"testing"
)

// recorder records how a helper ended the test; Skip and Fatal stop the
// goroutine as testing.T's do.
type recorder struct {
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped, r.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) {
	r.failed, r.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func run(f func(r *recorder)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
	return r
}

func TestMissingSkipsOutsideCI(t *testing.T) {
	t.Setenv("CI", "")
	r := run(func(r *recorder) { RequireTool(r, "aenv-no-such-tool", "nothing installs it") })
	if !r.skipped || r.failed {
		t.Fatalf("outside CI a missing tool skipped=%v failed=%v, want a skip", r.skipped, r.failed)
	}
}

func TestMissingFailsInCI(t *testing.T) {
	for _, v := range []string{"true", "TRUE", "1"} {
		t.Setenv("CI", v)
		r := run(func(r *recorder) { RequireTool(r, "aenv-no-such-tool", "nothing installs it") })
		if !r.failed || r.skipped {
			t.Fatalf("CI=%s: a missing tool skipped=%v failed=%v, want a failure", v, r.skipped, r.failed)
		}
	}
	t.Setenv("CI", "false")
	if Strict() {
		t.Fatal("CI=false counted as strict")
	}
}

func TestRequireToolFindsInstalled(t *testing.T) {
	t.Setenv("CI", "true")
	r := run(func(r *recorder) {
		if p := RequireTool(r, "sh", "base system"); p == "" {
			r.msg = "empty path"
		}
	})
	if r.skipped || r.failed || r.msg != "" {
		t.Fatalf("sh: skipped=%v failed=%v %s", r.skipped, r.failed, r.msg)
	}
}
