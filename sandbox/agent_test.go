package sandbox

import (
	"context"
	"net/http"
	"net/netip"
	"testing"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

// TestInitAgentVersion: the version a sandbox reports is the one its agent
// answers /init with, and a header that cannot be a version is ignored.
func TestInitAgentVersion(t *testing.T) {
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	cfg := w.Config()
	cfg.GuestNetNS = true
	m, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	slot, err := m.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	version := make(chan string, 1)
	l := nettest.Listen(t, slot.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, AgentPort))
	agent := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/init" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Envd-Version", <-version)
		w.WriteHeader(http.StatusNoContent)
	})}
	go agent.Serve(l)
	t.Cleanup(func() { agent.Close() })
	for sent, want := range map[string]string{"0.9.1": "0.9.1", "": "", "1.0\r\nX: y": "", "0.5.0-rc1": "0.5.0-rc1"} {
		version <- sent
		got, err := InitAgentVersion(t.Context(), slot, "", InitRequest{})
		if err != nil || got != want {
			t.Errorf("agent answering X-Envd-Version %q: reported %q (%v), want %q", sent, got, err, want)
		}
	}
}
