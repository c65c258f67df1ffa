package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
)

// sh runs a bash script as root in sandbox id through the proxy and
// returns its trimmed stdout; a non-zero exit fails the test.
func (n *node) sh(t *testing.T, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Transport: headerTransport{id, "49983"}}
	out, stderr, code, err := agentclient.RunWith(ctx, n.proxy, hc, []agentclient.Option{agentclient.WithUser("root")},
		"/bin/bash", "-c", script)
	if err != nil || code != 0 {
		t.Fatalf("sandbox %s: %q: exit %d, %v, stderr %s\n%s", id, script, code, err, stderr, n.diagnose(id))
	}
	return strings.TrimSpace(string(out))
}

// diagnose returns what the node logged about a sandbox and the tail of its
// newest guest console, for failure messages.
func (n *node) diagnose(id string) string {
	var b strings.Builder
	logs := n.Logs()
	fmt.Fprintf(&b, "aenvd log lines about the sandbox (of %d bytes logged):\n", len(logs))
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, id) || strings.Contains(strings.ToLower(l), "proxy") {
			b.WriteString(l + "\n")
		}
	}
	consoles, _ := filepath.Glob(filepath.Join(n.DataDir, "sandboxes", id, "run-*", "console.log"))
	sort.Strings(consoles)
	if len(consoles) > 0 {
		c, _ := os.ReadFile(consoles[len(consoles)-1])
		fmt.Fprintf(&b, "tail of %s:\n%s", consoles[len(consoles)-1], tailString(string(c), 3000))
	}
	return b.String()
}

// counterScript starts a background loop bumping a counter in tmpfs (guest
// memory) every 100 ms: it proves a process and memory contents survive.
// (Written aside and renamed, so a reader never sees a half-written file.)
const counterScript = `setsid nohup bash -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/counter.new; mv /dev/shm/counter.new /dev/shm/counter; sleep 0.1; done' >/dev/null 2>&1 < /dev/null & disown`

// counter reads the loop's counter and checks it still moves.
func (n *node) counter(t *testing.T, id string) int {
	t.Helper()
	out := n.sh(t, id, `for i in $(seq 50); do [ -s /dev/shm/counter ] && break; sleep 0.1; done; a=$(cat /dev/shm/counter); sleep 0.5; b=$(cat /dev/shm/counter); echo "$a $b"`)
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("sandbox %s: counter output %q", id, out)
	}
	a, _ := strconv.Atoi(f[0])
	b, _ := strconv.Atoi(f[1])
	if b <= a {
		t.Fatalf("sandbox %s: the counter loop stopped (%d then %d)", id, a, b)
	}
	return b
}

type snapshotJSON struct {
	SnapshotID   string   `json:"snapshotID"`
	Names        []string `json:"names"`
	SandboxID    string   `json:"sandboxID"`
	MemoryLayers int      `json:"memoryLayers"`
	RootfsLayers int      `json:"rootfsLayers"`
}

// TestSnapshotsAndFork: a named snapshot of a running sandbox restores its
// files, memory and processes into a new sandbox while the source runs on;
// a fork's children see the source's state and then diverge; snapshots in
// use cannot be deleted; bad requests get clear errors.
func TestSnapshotsAndFork(t *testing.T) {
	n := sharedNode(t)
	src := n.create(t, `{"templateID":"base","timeout":600}`)
	n.sh(t, src, counterScript+`; echo v1 > /home/user/a.txt; echo mem1 > /dev/shm/marker`)
	before := n.counter(t, src)

	name := fmt.Sprintf("snap-%d", time.Now().UnixNano())
	var snap snapshotJSON
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", n.key, `{"name":"`+name+`"}`)
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" || len(snap.Names) != 1 || snap.Names[0] != name || snap.SandboxID != src {
		t.Fatalf("create snapshot: %s (%v)", b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
	// The source runs on, and changes after the snapshot stay its own.
	if after := n.counter(t, src); after <= before {
		t.Fatalf("source counter went from %d to %d across the snapshot", before, after)
	}
	n.sh(t, src, `echo v2 > /home/user/a.txt`)

	for _, path := range []string{"/snapshots/" + snap.SnapshotID, "/snapshots/" + name} {
		var got snapshotJSON
		if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", path, n.key, ""), &got); err != nil || got.SnapshotID != snap.SnapshotID {
			t.Fatalf("GET %s: %+v %v", path, got, err)
		}
	}
	var listed []snapshotJSON
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/snapshots?sandboxID="+src, n.key, ""), &listed); err != nil ||
		len(listed) != 1 || listed[0].SnapshotID != snap.SnapshotID {
		t.Fatalf("list snapshots of %s: %+v %v", src, listed, err)
	}

	// A sandbox from the snapshot's name has the state as of the snapshot.
	restored := n.create(t, `{"templateID":"`+name+`","timeout":300}`)
	if got := n.sh(t, restored, `cat /home/user/a.txt /dev/shm/marker`); got != "v1\nmem1" {
		t.Fatalf("sandbox from snapshot sees %q, want v1 and mem1", got)
	}
	n.counter(t, restored)
	code, body, _ := n.call(t, "DELETE", "/snapshots/"+name, n.key, "")
	if code != http.StatusConflict {
		t.Fatalf("delete a snapshot in use: %d %s, want 409", code, body)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+restored, n.key, "")

	// Fork: children start from the source as it is now, then diverge.
	var kids []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	const count = 5
	b = n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/fork", n.key, fmt.Sprintf(`{"count":%d,"timeout":300}`, count))
	if err := json.Unmarshal(b, &kids); err != nil || len(kids) != count {
		t.Fatalf("fork: %s (%v)", b, err)
	}
	var ids []string
	for i, k := range kids {
		if k.Error != nil || k.Sandbox == nil {
			t.Fatalf("fork child %d failed: %s", i, b)
		}
		id := k.Sandbox.SandboxID
		ids = append(ids, id)
		t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })
	}
	for i, id := range ids {
		if got := n.sh(t, id, `cat /home/user/a.txt /dev/shm/marker`); got != "v2\nmem1" {
			t.Fatalf("fork child %s sees %q, want the source's v2 and mem1", id, got)
		}
		n.counter(t, id)
		n.sh(t, id, fmt.Sprintf(`echo child%d > /home/user/a.txt; echo child%d > /dev/shm/marker`, i, i))
	}
	for i, id := range ids {
		if got := n.sh(t, id, `cat /home/user/a.txt /dev/shm/marker`); got != fmt.Sprintf("child%d\nchild%d", i, i) {
			t.Fatalf("fork child %s sees %q after the others wrote theirs", id, got)
		}
	}
	if got := n.sh(t, src, `cat /home/user/a.txt /dev/shm/marker`); got != "v2\nmem1" {
		t.Fatalf("the source sees %q after its children wrote", got)
	}
	n.counter(t, src)

	// Bad input.
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/sandboxes/" + src + "/fork", `{"count":0}`, http.StatusBadRequest},
		{"POST", "/sandboxes/" + src + "/fork", `{"count":101}`, http.StatusBadRequest},
		{"POST", "/sandboxes/nosuchsandbox/fork", `{"count":1}`, http.StatusNotFound},
		{"POST", "/sandboxes/" + src + "/snapshots", `{"name":"bad name/../x"}`, http.StatusBadRequest},
		{"POST", "/sandboxes/" + src + "/snapshots", `{"name":"` + name + `"}`, http.StatusConflict},
		{"POST", "/sandboxes/nosuchsandbox/snapshots", `{}`, http.StatusNotFound},
		{"GET", "/snapshots/nosuchsnapshot", ``, http.StatusNotFound},
		{"POST", "/sandboxes", `{"templateID":"nosuchsnapshot"}`, http.StatusNotFound},
	} {
		n.expect(t, c.want, c.method, c.path, n.key, c.body)
	}
}

// createToken creates a sandbox and returns its id and agent access token.
func (n *node) createToken(t *testing.T, body string) (string, string) {
	t.Helper()
	var sbx struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes", n.key, body)
	if err := json.Unmarshal(b, &sbx); err != nil || sbx.SandboxID == "" {
		t.Fatalf("create %s: %s %v", body, b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+sbx.SandboxID, n.key, "") })
	return sbx.SandboxID, sbx.EnvdAccessToken
}

// run runs a command in a sandbox's agent with an access token ("" for
// none) and returns its stdout and the error of the call.
func (n *node) run(id, token, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []agentclient.Option{agentclient.WithUser("root")}
	if token != "" {
		opts = append(opts, agentclient.WithToken(token))
	}
	hc := &http.Client{Transport: headerTransport{id, "49983"}}
	out, stderr, code, err := agentclient.RunWith(ctx, n.proxy, hc, opts, "/bin/bash", "-c", script)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, stderr)
	}
	return strings.TrimSpace(string(out)), err
}

// TestSnapshotOfSecureSandbox: sandboxes created from a snapshot of a secure
// sandbox get their own access token (the source's no longer opens them),
// or none when they are not secure; both keep the snapshot's files.
func TestSnapshotOfSecureSandbox(t *testing.T) {
	n := sharedNode(t)
	src, srcToken := n.createToken(t, `{"templateID":"base","timeout":300,"secure":true}`)
	if srcToken == "" {
		t.Fatal("a secure sandbox came without an access token")
	}
	if _, err := n.run(src, srcToken, `echo secret > /home/user/s.txt`); err != nil {
		t.Fatalf("write in the source: %v", err)
	}
	var snap snapshotJSON
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", n.key, `{}`)
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("create snapshot: %s (%v)", b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })

	child, childToken := n.createToken(t, `{"templateID":"`+snap.SnapshotID+`","timeout":300,"secure":true}`)
	if childToken == "" || childToken == srcToken {
		t.Fatalf("secure sandbox from the snapshot: token %q (source %q)", childToken, srcToken)
	}
	if got, err := n.run(child, childToken, `cat /home/user/s.txt`); err != nil || got != "secret" {
		t.Fatalf("secure child with its token: %q %v\n%s", got, err, n.diagnose(child))
	}
	if _, err := n.run(child, srcToken, `true`); err == nil {
		t.Fatal("the source's token opens the secure child")
	}
	open, openToken := n.createToken(t, `{"templateID":"`+snap.SnapshotID+`","timeout":300}`)
	if openToken != "" {
		t.Fatalf("a sandbox created without secure got token %q", openToken)
	}
	if got, err := n.run(open, "", `cat /home/user/s.txt`); err != nil || got != "secret" {
		t.Fatalf("non-secure child without a token: %q %v\n%s", got, err, n.diagnose(open))
	}
	// A pause and resume keeps the child's own token.
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+child+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+child+"/connect", n.key, `{"timeout":300}`)
	if got, err := n.run(child, childToken, `cat /home/user/s.txt`); err != nil || got != "secret" {
		t.Fatalf("secure child after resume: %q %v\n%s", got, err, n.diagnose(child))
	}
}

// metricValue returns the first sample of a metric in aenvd's /metrics.
func (n *node) metricValue(t *testing.T, name string) float64 {
	t.Helper()
	text, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			return v
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestFailedCreateReleasesEverything: a create that fails in the VMM
// restore (a snapshot whose VM state was damaged on disk) answers an error
// and leaves no VMM process, storage device, network slot or sandbox.
func TestFailedCreateReleasesEverything(t *testing.T) {
	n := sharedNode(t)
	src := n.create(t, `{"templateID":"base","timeout":120}`)
	var snap snapshotJSON
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", n.key, `{}`)
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("create snapshot: %s (%v)", b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
	state := filepath.Join(n.DataDir, "snapshots", snap.SnapshotID, "vm", "state")
	if err := os.WriteFile(state, []byte(strings.Repeat("damaged ", 512)), 0o644); err != nil {
		t.Fatalf("damage the snapshot: %v", err)
	}

	sd := n.storaged(t)
	runtimeDevices := func() int {
		devs, err := sd.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		c := 0
		for _, d := range devs {
			if d.Kind == "runtime" {
				c++
			}
		}
		return c
	}
	listed := func() int {
		var all []sandboxJSON
		if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes", n.key, ""), &all); err != nil {
			t.Fatal(err)
		}
		return len(all)
	}
	devsBefore, slotsBefore, listedBefore := runtimeDevices(), n.metricValue(t, "aenv_network_slots_in_use"), listed()
	vmmsBefore := len(processesMentioning("qemu-system"))

	code, body, _ := n.call(t, "POST", "/sandboxes", n.key, `{"templateID":"`+snap.SnapshotID+`","timeout":60}`)
	if code < 500 || !strings.Contains(string(body), "restore") {
		t.Fatalf("create from a damaged snapshot: %d %s, want a 5xx naming the restore", code, body)
	}
	if got := runtimeDevices(); got != devsBefore {
		t.Errorf("storage devices: %d before the failed create, %d after", devsBefore, got)
	}
	if got := n.metricValue(t, "aenv_network_slots_in_use"); got != slotsBefore {
		t.Errorf("network slots in use: %v before the failed create, %v after", slotsBefore, got)
	}
	if got := listed(); got != listedBefore {
		t.Errorf("sandboxes listed: %d before the failed create, %d after", listedBefore, got)
	}
	if got := len(processesMentioning("qemu-system")); got > vmmsBefore {
		t.Errorf("QEMU processes: %d before the failed create, %d after", vmmsBefore, got)
	}
}
