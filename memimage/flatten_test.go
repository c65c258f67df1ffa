package memimage

import (
	"context"
	"testing"
	"time"
)

// TestFlattenerOneAtATime: flattens run one at a time, stop cancels a
// running one and waits for it, a queued one runs once the turn is free,
// and nothing starts after close.
func TestFlattenerOneAtATime(t *testing.T) {
	fl := newFlattener()
	running := make(chan string, 4)
	block := func(id string) func(ctx context.Context) {
		return func(ctx context.Context) {
			running <- id
			<-ctx.Done()
		}
	}
	fl.start("a", block("a"))
	if got := <-running; got != "a" {
		t.Fatalf("first flatten %q", got)
	}
	fl.start("b", block("b"))
	select {
	case got := <-running:
		t.Fatalf("%s ran while a held the turn", got)
	case <-time.After(100 * time.Millisecond):
	}
	fl.stop("a")
	select {
	case got := <-running:
		if got != "b" {
			t.Fatalf("after a stopped, %q ran", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b never ran after a stopped")
	}
	fl.close() // cancels b and waits for it
	fl.start("c", block("c"))
	select {
	case got := <-running:
		t.Fatalf("%s started after close", got)
	case <-time.After(100 * time.Millisecond):
	}
	fl.stop("c") // nothing to stop: returns at once
}
