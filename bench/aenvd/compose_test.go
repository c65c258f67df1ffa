package aenvdbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/composeproj"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/google/go-containerregistry/pkg/registry"
)

// composeRounds is how many projects BenchmarkComposeUp starts.
const composeRounds = 3

// BenchmarkComposeUp: the time to start a two-service Compose project
// (internal/testutil/composeproj, images in a registry on loopback) through
// POST /sandboxes-compose, client side to the answer (images pulled by the
// node, a compose-v1 sandbox created, the images loaded in the guest and
// docker-compose up done), against a plain create of the base template
// measured in the same run. The compose-v1 template's build on first use
// is done and timed apart, before the rounds. Medians of composeRounds;
// no time is asserted.
func BenchmarkComposeUp(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	b.Cleanup(cancel)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	b.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	file := composeproj.Push(b, host, "bench", "bench page\n")
	body, err := json.Marshal(map[string]any{"compose": file, "timeout": 600})
	if err != nil {
		b.Fatal(err)
	}
	n := startBenchNode(ctx, b, "adbcomp", 117, []string{"AENVD_IMAGE_INSECURE_REGISTRIES=" + host})
	t0 := time.Now()
	mustKill(b, n, composeUp(b, n, string(body)))
	first := time.Since(t0).Seconds()
	b.ResetTimer()
	for range b.N {
		var up, create []float64
		for range composeRounds {
			t0 := time.Now()
			id := composeUp(b, n, string(body))
			up = append(up, time.Since(t0).Seconds())
			mustKill(b, n, id)
			t0 = time.Now()
			id = mustCreate(b, n)
			create = append(create, time.Since(t0).Seconds())
			mustKill(b, n, id)
		}
		u, c := median(up), median(create)
		fmt.Printf("compose project start (2 services), medians of %d rounds:\n", composeRounds)
		fmt.Printf("  POST /sandboxes-compose %.2f s; a plain create %.2f s (compose %.1fx)\n", u, c, u/c)
		fmt.Printf("  first use, the compose-v1 template built on the node: %.1f s\n", first)
		b.ReportMetric(u/c, "compose-vs-create")
	}
}

// composeUp starts the project and returns its sandbox's id.
func composeUp(b *testing.B, n *aenvdtest.Node, body string) string {
	code, out, _, err := n.Call("POST", "/sandboxes-compose", n.Key, body)
	if err != nil || code != 201 {
		b.Fatalf("POST /sandboxes-compose: %d %s %v", code, out, err)
	}
	var s struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(out, &s); err != nil || s.SandboxID == "" {
		b.Fatalf("POST /sandboxes-compose: %s %v", out, err)
	}
	return s.SandboxID
}
