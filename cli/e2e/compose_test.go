package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/composeproj"
)

// guestPort GETs / on a sandbox's guest port through the node's proxy.
func guestPort(n *aenvdtest.Node, id, port string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, n.Proxy+"/", nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

// waitRelay waits until the relay answers through the proxy with want
// (its first fetch from web may still be on its way) and fails the test
// with the last answer after limit.
func waitRelay(t *testing.T, n *aenvdtest.Node, id, want string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		code, body, err := guestPort(n, id, composeproj.RelayPort)
		if err == nil && code == http.StatusOK && body == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay through the proxy after %s: status %d body %q err %v, want %q", limit, code, body, err, want)
		}
		time.Sleep(time.Second)
	}
}

// TestComposeUp: `aenv compose up -f FILE` starts a two-service project
// whose images come from the test's registry (pulled by the node, handed
// to the guest: the guest has no route to the registry); relay reaches web
// by its service name and answers through the node's proxy on its
// published port; a pause and resume keep both containers running (not
// restarted), and so does a fork's child; an image the node cannot pull is
// refused before any VM.
func TestComposeUp(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	c.timeout = 25 * time.Minute // the first use builds the compose-v1 template
	token := make([]byte, 16)
	rand.Read(token)
	page := "compose " + hex.EncodeToString(token) + "\n"
	file := filepath.Join(t.TempDir(), "compose.yaml")
	if err := os.WriteFile(file, []byte(composeproj.Push(t, registryHost, "v1", page)), 0o644); err != nil {
		t.Fatal(err)
	}

	before := len(c.list())
	missing := composeproj.File(registryHost+"/compose/missing:v1", registryHost+"/compose/relay:v1")
	if r := c.runIn(missing, "compose", "up", "-f", "-"); r.code != 1 || !strings.Contains(r.stderr, "compose/missing:v1") {
		t.Fatalf("a project with an image the registry lacks: want exit 1 naming it, got %s", r)
	}
	if after := len(c.list()); after != before {
		t.Fatalf("%d sandboxes after a refused project, %d before", after, before)
	}

	var s struct {
		SandboxID  string `json:"sandboxID"`
		TemplateID string `json:"templateID"`
	}
	c.okJSON(&s, "compose", "up", "-f", file, "--timeout", "20m")
	var ts []struct {
		TemplateID string   `json:"templateID"`
		Aliases    []string `json:"aliases"`
	}
	c.okJSON(&ts, "template", "list")
	if s.SandboxID == "" || !slices.ContainsFunc(ts, func(x struct {
		TemplateID string   `json:"templateID"`
		Aliases    []string `json:"aliases"`
	}) bool {
		return x.TemplateID == s.TemplateID && slices.Contains(x.Aliases, "compose-v1")
	}) {
		t.Fatalf("compose up answered sandbox %q of template %q, want one of compose-v1 (templates %+v)", s.SandboxID, s.TemplateID, ts)
	}
	t.Cleanup(func() { c.run("rm", s.SandboxID) })
	for _, l := range strings.Split(n.Logs(), "\n") {
		if strings.Contains(l, "compose images pulled") || strings.Contains(l, "compose project started") {
			t.Log(l) // where a project's start spends its time
		}
	}
	waitRelay(t, n, s.SandboxID, page, 3*time.Minute)

	// Room for a project's images: compose-v1's root filesystem is 16 GiB.
	free := strings.TrimSpace(c.ok("exec", s.SandboxID, "--", "sh", "-c", "df -m --output=avail / | tail -1").stdout)
	if mib, err := strconv.Atoi(free); err != nil || mib < 12<<10 {
		t.Fatalf("free space on the compose sandbox's root filesystem: %q MiB, want at least 12 GiB", free)
	}

	started := containerStarts(t, c, s.SandboxID)
	if len(strings.Fields(started)) != 2 {
		t.Fatalf("containers of the project: %q, want 2", started)
	}
	c.ok("pause", s.SandboxID)
	c.ok("resume", s.SandboxID)
	waitRelay(t, n, s.SandboxID, page, time.Minute)
	if again := containerStarts(t, c, s.SandboxID); again != started {
		t.Fatalf("containers after pause and resume: %q, before: %q (restarted or gone)", again, started)
	}

	// A fork's child runs the same project, its containers as they were.
	var kids []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
	}
	c.okJSON(&kids, "fork", s.SandboxID)
	if len(kids) != 1 || kids[0].Sandbox == nil || kids[0].Sandbox.SandboxID == "" {
		t.Fatalf("fork of the compose sandbox: %+v", kids)
	}
	kid := kids[0].Sandbox.SandboxID
	t.Cleanup(func() { c.run("rm", kid) })
	waitRelay(t, n, kid, page, time.Minute)
	if inKid := containerStarts(t, c, kid); inKid != started {
		t.Fatalf("containers in the fork's child: %q, in its parent: %q", inKid, started)
	}
}

// containerStarts lists the project's running containers with their start
// times, one per line, sorted.
func containerStarts(t *testing.T, c *cli, id string) string {
	t.Helper()
	r := c.ok("exec", id, "--", "sh", "-c",
		`docker ps --filter label=com.docker.compose.project=project --format '{{.Names}}@{{.ID}}' | sort | while IFS=@ read -r n i; do echo "$n@$(docker inspect -f '{{.State.StartedAt}}' "$i")"; done`)
	return strings.TrimSpace(r.stdout)
}
