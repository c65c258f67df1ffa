package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

type sandboxJSON struct {
	SandboxID string `json:"sandboxID"`
	State     string `json:"state"`
}

func (n *node) create(t *testing.T, body string) string {
	t.Helper()
	var sbx sandboxJSON
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes", n.key, body)
	if err := json.Unmarshal(b, &sbx); err != nil || sbx.SandboxID == "" {
		t.Fatalf("create %s: %s %v", body, b, err)
	}
	id := sbx.SandboxID
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })
	return id
}

// waitState polls GET /sandboxes/{id} until it reports state ("gone" for 404).
func (n *node) waitState(t *testing.T, id, state string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		code, b, _ := n.call(t, "GET", "/sandboxes/"+id, n.key, "")
		switch {
		case code == http.StatusNotFound:
			last = "gone"
		case code == http.StatusOK:
			var s sandboxJSON
			_ = json.Unmarshal(b, &s)
			last = s.State
		default:
			last = string(b)
		}
		if last == state {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sandbox %s: state %q after %s, want %q", id, last, within, state)
}

// TestTimeouts: a sandbox whose time runs out is killed, or paused with
// autoPause; traffic to a paused autoResume sandbox resumes it.
func TestTimeouts(t *testing.T) {
	n := sharedNode(t)
	killed := n.create(t, `{"templateID":"base","timeout":2}`)
	paused := n.create(t, `{"templateID":"base","timeout":2,"autoPause":true,"autoResume":{"enabled":true}}`)
	n.waitState(t, killed, "gone", 90*time.Second)
	n.waitState(t, paused, "paused", 90*time.Second)
	var detail struct {
		Lifecycle struct {
			AutoResume bool   `json:"autoResume"`
			OnTimeout  string `json:"onTimeout"`
		} `json:"lifecycle"`
	}
	_ = json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+paused, n.key, ""), &detail)
	if !detail.Lifecycle.AutoResume || detail.Lifecycle.OnTimeout != "pause" {
		t.Fatalf("lifecycle of the auto-paused sandbox: %+v", detail.Lifecycle)
	}
	// Traffic wakes it (the proxy resumes it before forwarding).
	if code := n.proxyGet(t, paused, "49983", "/health", ""); code != http.StatusNoContent {
		t.Fatalf("agent /health of an autoResume sandbox through the proxy: %d, want 204", code)
	}
	n.waitState(t, paused, "running", 5*time.Second)
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+paused, n.key, "")
}

// TestNodeMetricsNetworkHostRouting covers /nodes, Prometheus /metrics,
// sandbox metrics, the network policy update and host-based proxy routing.
func TestNodeMetricsNetworkHostRouting(t *testing.T) {
	n := sharedNode(t)
	body := n.expect(t, http.StatusCreated, "POST", "/sandboxes", n.key,
		`{"templateID":"base","timeout":120,"metadata":{"suite":"nodes"},"allow_internet_access":false,"network":{"denyOut":["8.8.8.8/32"],"allowPublicTraffic":false}}`)
	var created struct {
		SandboxID          string `json:"sandboxID"`
		TrafficAccessToken string `json:"trafficAccessToken"`
	}
	if err := json.Unmarshal(body, &created); err != nil || created.TrafficAccessToken == "" {
		t.Fatalf("create with allowPublicTraffic false: %s %v", body, err)
	}
	id := created.SandboxID
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })
	// Traffic to a user port needs the traffic token (nothing listens on
	// 8000: with the token the proxy gets through and answers 502).
	if code := n.proxyGetHeaders(t, id, "8000", "/", nil); code != http.StatusForbidden {
		t.Fatalf("user port without the traffic token: %d, want 403", code)
	}
	if code := n.proxyGetHeaders(t, id, "8000", "/", map[string]string{"E2b-Traffic-Access-Token": created.TrafficAccessToken}); code != http.StatusBadGateway {
		t.Fatalf("user port with the traffic token (no server): %d, want 502", code)
	}
	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, `{"templateID":"base","network":{"denyOut":["not a cidr"]}}`)

	var nodes []struct {
		NodeID string `json:"nodeID"`
		Vmm    struct {
			Driver string `json:"driver"`
			Accel  string `json:"accel"`
		} `json:"vmm"`
		MemoryTotalMB   int64 `json:"memoryTotalMB"`
		DiskTotalMB     int64 `json:"diskTotalMB"`
		CreateSuccesses int64 `json:"createSuccesses"`
		Sandboxes       struct {
			Running int `json:"running"`
		} `json:"sandboxes"`
		AllocatedMemoryMB int64 `json:"allocatedMemoryMB"`
		Disks             struct {
			Backend   string `json:"backend"`
			Transport string `json:"transport"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("/nodes: %+v %v", nodes, err)
	}
	nd := nodes[0]
	if nd.Vmm.Driver != "qemu" || nd.Vmm.Accel == "" || nd.MemoryTotalMB <= 0 || nd.DiskTotalMB <= 0 ||
		nd.Sandboxes.Running < 1 || nd.AllocatedMemoryMB < 256 || nd.CreateSuccesses < 1 {
		t.Fatalf("/nodes snapshot: %+v", nd)
	}
	// QEMU takes its disks over NBD straight from storaged's socket.
	if nd.Disks.Backend != "storaged" || nd.Disks.Transport != "nbd-socket" {
		t.Fatalf("/nodes disks: %+v", nd.Disks)
	}
	n.expect(t, http.StatusOK, "GET", "/nodes/"+nd.NodeID, n.key, "")
	n.expect(t, http.StatusNotFound, "GET", "/nodes/no-such-node", n.key, "")
	n.expect(t, http.StatusUnauthorized, "GET", "/nodes", "", "")

	var samples []struct {
		MemTotal  int64 `json:"memTotal"`
		DiskTotal int64 `json:"diskTotal"`
		CpuCount  int   `json:"cpuCount"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id+"/metrics", n.key, ""), &samples); err != nil ||
		len(samples) < 1 || samples[len(samples)-1].MemTotal <= 0 || samples[len(samples)-1].DiskTotal <= 0 ||
		samples[len(samples)-1].CpuCount != 1 { // the history: a sample every few seconds since the create
		t.Fatalf("sandbox metrics: %+v %v", samples, err)
	}

	// v1 list with a metadata filter.
	var listed []sandboxJSON
	_ = json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes?metadata=suite%3Dnodes", n.key, ""), &listed)
	if len(listed) != 1 || listed[0].SandboxID != id {
		t.Fatalf("v1 list by metadata: %+v", listed)
	}
	_ = json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes?metadata=suite%3Dother", n.key, ""), &listed)
	if len(listed) != 0 {
		t.Fatalf("v1 list by another metadata value: %+v", listed)
	}
	// Refreshes only extend the end time.
	endAt := func() time.Time {
		var d struct {
			EndAt time.Time `json:"endAt"`
		}
		_ = json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &d)
		return d.EndAt
	}
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/refreshes", n.key, `{"duration":600}`)
	extended := endAt()
	if time.Until(extended) < 550*time.Second {
		t.Fatalf("refresh by 600 s: endAt %s", extended)
	}
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/refreshes", n.key, `{"duration":10}`)
	if got := endAt(); !got.Equal(extended) {
		t.Fatalf("a shorter refresh moved endAt from %s to %s", extended, got)
	}

	n.expect(t, http.StatusNoContent, "PUT", "/sandboxes/"+id+"/network", n.key, `{"allow_internet_access":true,"allowOut":["1.1.1.1"]}`)
	n.expect(t, http.StatusBadRequest, "PUT", "/sandboxes/"+id+"/network", n.key, `{"denyOut":["300.1.2.3/8"]}`)
	n.expect(t, http.StatusBadRequest, "PUT", "/sandboxes/"+id+"/network", n.key, `{"denyOut":`)
	n.expect(t, http.StatusNotFound, "PUT", "/sandboxes/nosuchsandbox/network", n.key, `{}`)

	// Host routing on the API port: {port}-{id}.{domain}. /envs exists only
	// on the agent (the API would answer 401 without a key).
	req, _ := http.NewRequest("GET", n.api+"/envs", nil)
	req.Host = "49983-" + id + "." + testDomain
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	envs, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(envs), "{") {
		t.Fatalf("host-routed agent /envs: %d %s", resp.StatusCode, envs)
	}

	resp, err = http.Get(n.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`aenvd_sandbox_operation_seconds_bucket{op="create",result="success"`, `aenvd_sandbox_operations_total{op="create",result="success"}`} {
		if !strings.Contains(string(text), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

func (n *node) proxyGetHeaders(t *testing.T, id, port, path string, headers map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", n.proxy+path, nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("proxy GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestConcurrentLifecycleCalls fires pauses, connects, timeouts and kills at
// one sandbox at once: each call gets a lifecycle answer (never a 5xx), the
// sandbox ends gone, and its VMM process does not outlive it.
func TestConcurrentLifecycleCalls(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	calls := []struct{ method, path, body string }{
		{"POST", "/sandboxes/" + id + "/pause", ""},
		{"POST", "/sandboxes/" + id + "/pause", ""},
		{"POST", "/sandboxes/" + id + "/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":60}`},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":120}`},
		{"GET", "/sandboxes/" + id, ""},
		{"POST", "/sandboxes/" + id + "/pause", ""},
	}
	allowed := map[int]bool{200: true, 201: true, 204: true, 404: true, 409: true}
	type result struct {
		call string
		code int
		body string
	}
	results := make(chan result, len(calls)+1)
	start := make(chan struct{})
	for _, c := range calls {
		go func() {
			<-start
			code, b, _, err := n.Call(c.method, c.path, n.key, c.body)
			if err != nil {
				b = []byte(err.Error())
			}
			results <- result{c.method + " " + c.path, code, string(b)}
		}()
	}
	go func() {
		<-start
		time.Sleep(300 * time.Millisecond) // let some of the others begin
		code, b, _, err := n.Call("DELETE", "/sandboxes/"+id, n.key, "")
		if err != nil {
			b = []byte(err.Error())
		}
		results <- result{"DELETE", code, string(b)}
	}()
	close(start)
	for range len(calls) + 1 {
		r := <-results
		if !allowed[r.code] {
			t.Errorf("%s: status %d: %s", r.call, r.code, r.body)
		}
		if r.call == "DELETE" && r.code != http.StatusNoContent {
			t.Errorf("the only kill: status %d, want 204: %s", r.code, r.body)
		}
	}
	n.expect(t, http.StatusNotFound, "GET", "/sandboxes/"+id, n.key, "")
	n.expect(t, http.StatusNotFound, "DELETE", "/sandboxes/"+id, n.key, "")
	deadline := time.Now().Add(10 * time.Second)
	for len(processesMentioning(id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if pids := processesMentioning(id); len(pids) > 0 {
		t.Fatalf("VMM processes of killed sandbox %s still run: %v", id, pids)
	}
}
