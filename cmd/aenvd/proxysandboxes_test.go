package main

import (
	"slices"
	"testing"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/proxy"
	"github.com/agentenv/agentenv/sandbox"
)

// endedIDs records the sandboxes whose streams the proxy was told to end.
type endedIDs []string

func (e *endedIDs) Ended(id, _ string) { *e = append(*e, id) }

// TestProxyEvents checks that only a kill or a pause ends a sandbox's
// streams at the proxy.
func TestProxyEvents(t *testing.T) {
	var got endedIDs
	f := proxyEvents(&got)
	f(orchestrator.Event{Type: orchestrator.EventKilled, SandboxID: "k"})
	f(orchestrator.Event{Type: orchestrator.EventPaused, SandboxID: "p"})
	f(orchestrator.Event{Type: orchestrator.EventCreated, SandboxID: "c"})
	f(orchestrator.Event{Type: orchestrator.EventResumed, SandboxID: "r"})
	if want := []string{"k", "p"}; !slices.Equal(got, want) {
		t.Fatalf("ended %v, want %v", got, want)
	}
}

// TestProxySandbox checks the states the proxy acts on and the agent port
// it assumes.
func TestProxySandbox(t *testing.T) {
	if proxy.AgentPort != sandbox.AgentPort {
		t.Fatalf("proxy.AgentPort %d, sandbox.AgentPort %d", proxy.AgentPort, sandbox.AgentPort)
	}
	for st, want := range map[orchestrator.State]proxy.Sandbox{
		orchestrator.Running:  {},
		orchestrator.Resuming: {},
		orchestrator.Paused:   {Paused: true},
		orchestrator.Killing:  {Killing: true},
	} {
		if got := proxySandbox(orchestrator.Record{State: st}); got != want {
			t.Errorf("state %s: %+v, want %+v", st, got, want)
		}
	}
	rec := orchestrator.Record{State: orchestrator.Running, AutoResume: true, FilesystemOnly: true,
		TrafficToken: "t", MaskRequestHost: "m", AccessToken: "a", Secure: true}
	want := proxy.Sandbox{AutoResume: true, FilesystemOnly: true, TrafficToken: "t", MaskRequestHost: "m", AccessToken: "a", Secure: true}
	if got := proxySandbox(rec); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
