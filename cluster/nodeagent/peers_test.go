package nodeagent

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestAgentsLearnPeers: two nodes registered with one scheduler each get
// the other's P2P endpoint, never their own; a node that leaves drops out
// of the other's list.
func TestAgentsLearnPeers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	served := startScheduler(t, log, nil)
	var mu sync.Mutex
	seen := map[string][]string{}
	start := func(name string) context.CancelFunc {
		a, err := New(Options{Schedulers: []string{served.Addr}, Name: name, APIURL: "http://127.0.0.1:1",
			P2PEndpoint: "http://" + name + ":3002", VMM: "qemu", Logger: log, RetryInterval: 50 * time.Millisecond,
			Source: &fixedSource{u: Usage{CPUs: 2, FreeCPUs: 2, MemoryMB: 1024, FreeMemoryMB: 1024}},
			OnPeers: func(eps []string) {
				mu.Lock()
				defer mu.Unlock()
				seen[name] = eps
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done; a.Close() })
		return func() { cancel(); <-done }
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: peers seen %v", what, seen)
			}
		}
	}
	start("a")
	stopB := start("b")
	until("each node learns the other", func() bool {
		return slices.Equal(seen["a"], []string{"http://b:3002"}) && slices.Equal(seen["b"], []string{"http://a:3002"})
	})
	stopB() // a graceful leave: b unregisters
	until("a node that left is no peer", func() bool { return len(seen["a"]) == 0 })
}
