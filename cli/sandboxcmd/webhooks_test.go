package sandboxcmd

import (
	"encoding/json"
	"github.com/agentenv/agentenv/disk/disktest"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// realNode serves the node's real API handler (no VMs: the orchestrator
// has no driver) with a real webhook dispatcher.
func realNode(t *testing.T) nodeFixture {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := webhooks.New(st, webhooks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.NewHandler(api.Options{Orchestrator: o, Store: st, Webhooks: d, APIKey: "k",
		Node: api.NodeInfo{ID: "node1"}, DefaultTimeout: time.Minute, MaxTimeout: time.Hour}))
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
	return nodeFixture{d: d}
}

type nodeFixture struct{ d *webhooks.Dispatcher }

func TestWebhookCommands(t *testing.T) {
	n := realNode(t)
	out, err := run("webhook", "create", "http://127.0.0.1:9/hook", "--name", "mine", "--secret", "s", "--event", "sandbox.lifecycle.killed", "-o", "json")
	var h wire.WebhookConfig
	if err != nil || json.Unmarshal([]byte(out), &h) != nil || h.Id == "" || len(h.Events) != 1 || h.Name != "mine" {
		t.Fatalf("webhook create: %v\n%s", err, out)
	}
	out, err = run("webhook", "list")
	if err != nil || !strings.Contains(out, "WEBHOOK ID") || !strings.Contains(out, h.Id) || !strings.Contains(out, "sandbox.lifecycle.killed") {
		t.Fatalf("webhook list: %v\n%s", err, out)
	}
	if _, err := run("webhook", "create", "ftp://x/"); err == nil || !strings.Contains(err.Error(), "url") {
		t.Errorf("a bad URL was accepted: %v", err)
	}
	if _, err := run("webhook", "rm", h.Id); err != nil {
		t.Fatal(err)
	}
	if len(n.d.List()) != 0 {
		t.Error("webhook rm left the webhook")
	}
	if _, err := run("webhook", "rm", h.Id); err == nil {
		t.Error("removing a removed webhook succeeded")
	}
}

func TestNodeDrainCommands(t *testing.T) {
	realNode(t)
	status := func() string {
		out, err := run("nodes", "-o", "json")
		var ns []wire.Node
		if err != nil || json.Unmarshal([]byte(out), &ns) != nil || len(ns) != 1 {
			t.Fatalf("nodes: %v\n%s", err, out)
		}
		return string(ns[0].Status)
	}
	if out, err := run("node", "drain", "node1"); err != nil || status() != "draining" || !strings.Contains(out, "draining true") {
		t.Fatalf("node drain: %v, status %s\n%s", err, status(), out)
	}
	if out, err := run("node", "undrain", "node1"); err != nil || status() != "ready" || !strings.Contains(out, "draining false") {
		t.Fatalf("node undrain: %v, status %s\n%s", err, status(), out)
	}
	if _, err := run("node", "drain", "other"); err == nil {
		t.Error("draining an unknown node succeeded")
	}
	if _, err := run("drain", "node1"); err == nil {
		t.Error("`aenv drain` still exists beside `aenv node drain`")
	}
}
