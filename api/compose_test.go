package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/compose"
	"github.com/agentenv/agentenv/composeup"
	"github.com/agentenv/agentenv/oci"
)

func composeBody(t *testing.T, file string) string {
	t.Helper()
	b, err := json.Marshal(wire.NewComposeSandbox{Compose: file})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestComposeRefusesHostileFiles: the real handler refuses each hostile
// file with 400 naming the offending key, and the node has no sandbox
// afterwards (nothing was started for it).
func TestComposeRefusesHostileFiles(t *testing.T) {
	opts := testOptions(t)
	h := NewHandler(opts)
	cases := map[string]struct{ file, path string }{
		"privileged":   {"services:\n  web:\n    image: alpine\n    privileged: true\n", "services.web.privileged"},
		"host mount":   {"services:\n  web:\n    image: alpine\n    volumes: [\"/:/host\"]\n", "services.web.volumes[0]"},
		"host network": {"services:\n  web:\n    image: alpine\n    network_mode: host\n", "services.web.network_mode"},
		"build":        {"services:\n  web:\n    build: .\n", "services.web.build"},
		"alias bomb": {"x-a: &a [x, x, x, x, x, x, x, x, x, x]\nx-b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n" +
			"x-c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nx-d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n" +
			"x-e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nservices: {web: {image: alpine, command: *e}}\n", "x-e"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w := do(h, "POST", "/sandboxes-compose", testKey, composeBody(t, tc.file))
			checkError(t, w)
			if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.path) {
				t.Fatalf("status %d body %s, want 400 naming %s", w.Code, w.Body, tc.path)
			}
		})
	}
	if n := len(opts.Orchestrator.List()); n != 0 {
		t.Fatalf("the node has %d sandboxes after refusals", n)
	}
}

// TestComposeBounds: a body without a file, a file over the limit and a
// request without the API key are refused before validation.
func TestComposeBounds(t *testing.T) {
	h := newTestHandler(t)
	big := composeBody(t, "services: {a: {image: alpine}}\n#"+strings.Repeat("x", compose.MaxFileBytes))
	cases := []struct {
		name, key, body, want string
		code                  int
	}{
		{"no key", "", composeBody(t, twoServiceFile), "X-API-Key", 401},
		{"no file", testKey, `{}`, "compose is required", 400},
		{"not JSON", testKey, `services:`, "invalid JSON", 400},
		{"too large", testKey, big, "more than the", 400},
		{"bad timeout", testKey, `{"compose": "services: {a: {image: alpine}}", "timeout": -1}`, "timeout", 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := do(h, "POST", "/sandboxes-compose", tc.key, tc.body)
			checkError(t, w)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
				t.Fatalf("status %d body %s, want %d saying %q", w.Code, w.Body, tc.code, tc.want)
			}
		})
	}
}

const twoServiceFile = `
services:
  web:
    image: registry.example:5000/web:1
    ports: ["8080:8080"]
    networks: [backend]
  client:
    image: registry.example:5000/client:1
    depends_on: [web]
    networks: [backend]
networks:
  backend:
`

// TestComposeValidFileWithoutTemplate: a valid project reaches a node
// without an image puller for compose projects: 501 says so (and that the file
// was valid), and no sandbox is left claiming to run it; a draining node
// answers 503 as for any create.
func TestComposeValidFileWithoutTemplate(t *testing.T) {
	opts := testOptions(t)
	h := NewHandler(opts)
	w := do(h, "POST", "/sandboxes-compose", testKey, composeBody(t, twoServiceFile))
	checkError(t, w)
	if w.Code != http.StatusNotImplemented || !strings.Contains(w.Body.String(), "no image puller") ||
		!strings.Contains(w.Body.String(), "2 services") {
		t.Fatalf("status %d body %s, want 501 naming the missing puller", w.Code, w.Body)
	}
	if n := len(opts.Orchestrator.List()); n != 0 {
		t.Fatalf("the node has %d sandboxes after a compose create it cannot run", n)
	}
	if w := do(h, "POST", "/nodes/node1", testKey, `{"status":"draining"}`); w.Code != http.StatusNoContent {
		t.Fatalf("drain: %d %s", w.Code, w.Body)
	}
	if w := do(h, "POST", "/sandboxes-compose", testKey, composeBody(t, twoServiceFile)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("while draining: %d %s, want 503", w.Code, w.Body)
	}
}

// failingPull is a ComposeStarter whose pulls fail with err.
type failingPull struct {
	asked []string
	err   error
}

func (f *failingPull) Pull(_ context.Context, images []string) (*composeup.Archive, error) {
	f.asked = images
	return nil, fmt.Errorf("pull the compose project's images %s: %w", strings.Join(images, ", "), f.err)
}

func (f *failingPull) Up(context.Context, composeup.Guest, *composeup.Archive, []byte) error {
	return errors.New("Up called after a failed pull")
}

// TestComposeFailedPullStartsNothing: the images are pulled before any VM
// starts, so an image the node cannot pull answers 502 naming it and
// leaves no sandbox.
// A reference the node refuses itself (a registry not allowed) is the
// client's error, 400; any other failure a registry's, 502.
func TestComposeFailedPullStartsNothing(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{errors.New("manifest unknown"), http.StatusBadGateway},
		{fmt.Errorf("oci: reference: %w: registry registry.example:5000 is not in the allowed registries", oci.ErrRefused), http.StatusBadRequest},
	} {
		opts := testOptions(t)
		fp := &failingPull{err: tc.err}
		opts.Compose = fp
		h := NewHandler(opts)
		w := do(h, "POST", "/sandboxes-compose", testKey, composeBody(t, twoServiceFile))
		checkError(t, w)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), "registry.example:5000/client:1") {
			t.Fatalf("pull failing with %v: status %d body %s, want %d naming the images", tc.err, w.Code, w.Body, tc.code)
		}
		if want := []string{"registry.example:5000/web:1", "registry.example:5000/client:1"}; !slices.Equal(fp.asked, want) {
			t.Fatalf("pulled %v, want %v", fp.asked, want)
		}
		if n := len(opts.Orchestrator.List()); n != 0 {
			t.Fatalf("the node has %d sandboxes after a failed pull", n)
		}
	}
}
