package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestHooks: before-hooks run in registration order, a hook's ErrNotFound
// is no error while any other fails the verb, and a cancelled hook runs no
// more.
func TestHooks(t *testing.T) {
	o := &Orchestrator{}
	if o.hasMissingHooks() {
		t.Fatal("no hook registered, but hasMissingHooks")
	}
	var ran []string
	o.Hook(Hooks{MissingSandbox: func(_ context.Context, id string) error {
		ran = append(ran, "first "+id)
		return fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}})
	boom := errors.New("boom")
	cancel := o.Hook(Hooks{MissingSandbox: func(_ context.Context, id string) error {
		ran = append(ran, "second "+id)
		return boom
	}, Removed: func(rec Record) { ran = append(ran, "removed "+rec.ID) }})
	if !o.hasMissingHooks() {
		t.Fatal("hooks registered, but not hasMissingHooks")
	}
	if err := o.beforeMissingSandbox(context.Background(), "a"); !errors.Is(err, boom) {
		t.Fatalf("before-hooks: %v, want %v", err, boom)
	}
	if err := o.beforeMissingSource(context.Background(), "a"); err != nil {
		t.Fatalf("no source hook: %v", err)
	}
	o.afterRemoved(Record{ID: "a"})
	cancel()
	if err := o.beforeMissingSandbox(context.Background(), "b"); err != nil {
		t.Fatalf("after cancel: %v (the ErrNotFound of the first hook is no error)", err)
	}
	o.afterRemoved(Record{ID: "b"})
	if want := []string{"first a", "second a", "removed a", "first b"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
}
