package clusterbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/cluster/gateway"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// creates is how many sandboxes each path makes per iteration, one at a
// time.
const creates = 9

const createBody = `{"templateID":"base","timeout":120,"metadata":{"suite":"bench-cluster"}}`

// BenchmarkCreateThroughGateway: a create through the gateway (Place on
// the scheduler, the create forwarded to the node, Bind) vs the same
// create sent to the node directly, in one run against one aenvd node that
// registered with the scheduler. The two paths alternate, each round in
// the other order (the machine is shared; its speed drifts), and every
// sandbox is killed before the next create. The figures are p50s of the
// client's wall clock per create, and the p50 of the differences within
// each round's pair: a create's own spread under TCG (tens of ms) hides
// the gateway's few ms in the p50s alone.
func BenchmarkCreateThroughGateway(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root (network namespaces, taps)")
	}
	guestassets.Get(b)
	st := newStack(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "acbn", CIDRBase: 160,
		Env: []string{"AENVD_CLUSTER_SCHEDULER=" + st.addr, "AENVD_CLUSTER_NODE_NAME=bench-node"}})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	waitRegistered(b, st.sched, "bench-node")
	gw := httptest.NewServer(gateway.New(gateway.Options{Scheduler: st.sched,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	defer gw.Close()
	client := &http.Client{Timeout: 3 * time.Minute}
	defer client.CloseIdleConnections()
	paths := []hop{{name: "direct", url: n.API}, {name: "gateway", url: gw.URL}}
	for _, h := range paths { // warm up: page cache, network pool, connections
		createKill(b, client, h.url)
	}
	b.ResetTimer()
	for range b.N {
		took := map[string][]time.Duration{}
		for r := range creates {
			for i := range paths {
				h := paths[(r+i)%len(paths)]
				took[h.name] = append(took[h.name], createKill(b, client, h.url))
			}
		}
		d, g := p50(took["direct"]), p50(took["gateway"])
		ratio := g.Seconds() / d.Seconds()
		diffs := make([]time.Duration, creates)
		for r := range creates {
			diffs[r] = took["gateway"][r] - took["direct"][r]
		}
		fmt.Printf("create p50 over %d sequential creates each: direct %.1f ms, through the gateway %.1f ms = %.3fx; "+
			"p50 of the paired differences %+.1f ms\n", creates, ms(d), ms(g), ratio, ms(p50(diffs)))
		b.ReportMetric(ms(d), "direct-p50-ms")
		b.ReportMetric(ms(g), "gateway-p50-ms")
		b.ReportMetric(ratio, "gateway-vs-direct")
		b.ReportMetric(ms(p50(diffs)), "gateway-extra-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// createKill times one create at base (a node's API or the gateway's) and
// kills the sandbox there.
func createKill(b *testing.B, client *http.Client, base string) time.Duration {
	t0 := time.Now()
	code, body := send(b, client, "POST", base+"/sandboxes", createBody)
	took := time.Since(t0)
	var s struct {
		SandboxID string `json:"sandboxID"`
	}
	if code != http.StatusCreated || json.Unmarshal(body, &s) != nil || s.SandboxID == "" {
		b.Fatalf("create at %s: %d %s", base, code, body)
	}
	if code, body := send(b, client, "DELETE", base+"/sandboxes/"+s.SandboxID, ""); code != http.StatusNoContent {
		b.Fatalf("kill %s at %s: %d %s", s.SandboxID, base, code, body)
	}
	return took
}

func send(b *testing.B, client *http.Client, method, url, body string) (int, []byte) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("X-API-Key", aenvdtest.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		b.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// waitRegistered waits for the node's registration with the scheduler.
func waitRegistered(b *testing.B, c pb.SchedulerClient, name string) {
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := c.ListNodes(context.Background(), &pb.ListNodesRequest{})
		if err == nil && len(r.GetNodes()) == 1 && r.GetNodes()[0].GetStatus().GetName() == name {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("node %s never registered with the scheduler: %v (err %v)", name, r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
