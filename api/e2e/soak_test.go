package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/panicscan"
)

// soakRestores is the CI size of TestSDKRestoreSoak (12 resumes and 6
// forks, about 80 s at the 4.4 s per restore measured on two cores under
// TCG); AENV_SOAK_RESTORES changes it (make soak runs 1,000).
const soakRestores = 18

// soakProgress is how often a long soak logs its progress, in restores.
const soakProgress = 50

// TestSDKRestoreSoak restores one sandbox over and over through E2B's SDK
// (soak.mjs, with the newest SDK: its createSnapshot is the fork step) and
// fails on any wrong byte or guest crash. The script seeds the sandbox with
// random bytes in memory and on disk, then mixes pause and connect with
// forks (a snapshot and a sandbox created from it, which carries on); after
// each restore it checks every seeded byte, the memory written after the
// restore before and a background process, against sums made on the host.
// The test then scans the restored guest's kernel log (dmesg) and its VM's
// console log for panics, oopses and BUG reports (panicscan) before it lets
// the script go on, so nothing is killed unscanned. It prints the restores
// done, the crashes found and the time per restore.
func TestSDKRestoreSoak(t *testing.T) {
	n := sharedNode(t)
	restores := soakRestores
	if s := os.Getenv("AENV_SOAK_RESTORES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("AENV_SOAK_RESTORES=%q: want a positive count", s)
		}
		restores = v
	}
	v := sdkVersions[len(sdkVersions)-1]
	// A bound far above the measured time per restore, for a hung run only.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+time.Duration(restores)*time.Minute)
	defer cancel()
	cmd := sdkCommand(ctx, t, n, v, "soak.mjs", "AENV_SOAK_RESTORES="+strconv.Itoa(restores))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start soak.mjs: %v", err)
	}
	begin := time.Now()
	r := n.followSoak(t, stdin, stdout)
	werr := cmd.Wait()
	t.Logf("soak output (SDK %s):\n%s%s", v.version, tailString(r.out.String(), 4000), stderr.String())
	t.Logf("%d restores through the SDK, %d guest panics; %s per restore with the scan, %s in all with the create and seeding; with the checks, without the scan: %s",
		r.restores, r.panics, r.perRestore(), time.Since(begin).Round(time.Second), r.kindTimes())
	switch {
	case r.crash != "":
		t.Fatalf("guest crash after restore %d:\n%s", r.restores, r.crash)
	case r.failure != "":
		t.Fatalf("after restore %d: %s", r.restores, r.failure)
	case werr != nil:
		t.Fatalf("soak with SDK %s failed after %d restores: %v\naenvd log tail:\n%s", v.version, r.restores, werr, tailString(n.logs(), 4000))
	case r.restores != restores || !strings.Contains(r.out.String(), "soak scenario passed"):
		t.Fatalf("the soak stopped after %d of %d restores", r.restores, restores)
	}
}

// soakRun is what the test saw of a soak: restores reported (each byte
// checked by the script), the first crash report or scan failure.
type soakRun struct {
	out              strings.Builder
	restores, panics int
	crash, failure   string
	start, last      time.Time // when restore 1 and the last one were reported
	// kinds has, per kind of restore (resume, fork), how long each took
	// with the script's checks (the test's scan not counted).
	kinds map[string][]time.Duration
}

// kindTimes renders the mean and the slowest time of each kind of restore.
func (r *soakRun) kindTimes() string {
	var parts []string
	for _, kind := range []string{"resume", "fork"} {
		ds := r.kinds[kind]
		if len(ds) == 0 {
			continue
		}
		var sum, slowest time.Duration
		for _, d := range ds {
			sum += d
			slowest = max(slowest, d)
		}
		parts = append(parts, fmt.Sprintf("%d %ss: mean %s, slowest %s", len(ds), kind,
			(sum/time.Duration(len(ds))).Round(10*time.Millisecond), slowest))
	}
	return strings.Join(parts, "; ")
}

// perRestore is the mean time of a restore with its checks and scan,
// restores 2 to n (the sandbox's create and seeding left out).
func (r *soakRun) perRestore() time.Duration {
	if r.restores < 2 {
		return 0
	}
	return (r.last.Sub(r.start) / time.Duration(r.restores-1)).Round(10 * time.Millisecond)
}

// followSoak reads soak.mjs's output, scans each restored sandbox for a
// crash and tells the script to go on ("next") or stop.
func (n *node) followSoak(t *testing.T, stdin io.WriteCloser, stdout io.Reader) *soakRun {
	defer stdin.Close()
	r := &soakRun{kinds: map[string][]time.Duration{}}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		r.out.WriteString(line + "\n")
		var i, ms int
		var kind, id string
		if k, _ := fmt.Sscanf(line, "restored %d %s %s %d", &i, &kind, &id, &ms); k != 4 {
			continue
		}
		r.kinds[kind] = append(r.kinds[kind], time.Duration(ms)*time.Millisecond)
		if i == 1 {
			r.start = time.Now() // restores 2..n are timed from here
		}
		reply := "next\n"
		crash, err := n.scanGuest(id)
		switch {
		case crash != "":
			r.panics++
			r.crash = fmt.Sprintf("restore %d (%s) of sandbox %s:\n%s", i, kind, id, crash)
			reply = "stop\n"
		case err != nil:
			r.failure = err.Error()
			reply = "stop\n"
		}
		r.restores, r.last = i, time.Now()
		if i%soakProgress == 0 {
			t.Logf("%d restores, %d guest panics, %s per restore", r.restores, r.panics, r.perRestore())
		}
		if _, err := io.WriteString(stdin, reply); err != nil {
			r.failure = fmt.Sprintf("reply to soak.mjs: %v", err)
			break
		}
	}
	return r
}

// scanGuest returns the first crash report in a running sandbox's console
// log or its kernel log, or an error when either cannot be read.
func (n *node) scanGuest(id string) (string, error) {
	consoles, _ := filepath.Glob(filepath.Join(n.DataDir, "sandboxes", id, "run-*", "console.log"))
	if len(consoles) == 0 {
		return "", fmt.Errorf("scan sandbox %s: no console log under its run directories", id)
	}
	for _, c := range consoles {
		b, err := os.ReadFile(c)
		if err != nil {
			return "", fmt.Errorf("scan sandbox %s: %w", id, err)
		}
		if p := panicscan.Scan(b); p != "" {
			return c + ":\n" + p, nil
		}
	}
	out, err := n.dmesg(id)
	if err != nil {
		return "", fmt.Errorf("scan sandbox %s: %w\n%s", id, err, n.diagnose(id))
	}
	if p := panicscan.Scan(out); p != "" {
		return "dmesg:\n" + p, nil
	}
	return "", nil
}

// dmesg reads a running sandbox's kernel log as root through the proxy,
// with the agent access token its record holds (the SDK's sandboxes are
// secure).
func (n *node) dmesg(id string) ([]byte, error) {
	code, b, _, err := n.Call("GET", "/sandboxes/"+id, n.key, "")
	if err != nil {
		return nil, fmt.Errorf("get sandbox: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("get sandbox: status %d: %s", code, b)
	}
	var sbx struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(b, &sbx); err != nil {
		return nil, fmt.Errorf("get sandbox: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Transport: headerTransport{id, "49983"}}
	opts := []agentclient.Option{agentclient.WithUser("root"), agentclient.WithToken(sbx.EnvdAccessToken)}
	out, stderr, code, err := agentclient.RunWith(ctx, n.proxy, hc, opts, "dmesg")
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, bytes.TrimSpace(stderr))
	}
	if err != nil {
		return nil, fmt.Errorf("dmesg: %w", err)
	}
	return out, nil
}
