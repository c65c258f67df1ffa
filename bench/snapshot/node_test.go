package snapshotbench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"golang.org/x/sys/unix"
)

// guestMiB is the guest RAM of every sandbox here: aenvd's production
// default (aenvdtest lowers it to 256 for tests).
const guestMiB = 512

var (
	nodeOnce sync.Once
	shared   *node
	nodeErr  error
)

// TestMain stops the shared node (and its storage daemon) after the run.
//
// SNBENCH_THP_DISABLE=1 is an experiment knob: it sets PR_SET_THP_DISABLE
// on this process, which aenvd and its QEMU processes inherit (fork and
// exec keep it), to see how much transparent huge pages add to PSS.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("SNBENCH_THP_DISABLE") == "1" {
		if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "PR_SET_THP_DISABLE:", err)
			os.Exit(1)
		}
		fmt.Println("THP disabled for aenvd and its VMMs (PR_SET_THP_DISABLE)")
	}
	code := m.Run()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close aenvd:", err)
		}
	}
	os.Exit(code)
}

type node struct {
	*aenvdtest.Node
	hc map[string]*http.Client
	mu sync.Mutex
}

// sharedNode starts one aenvd for the package (the first start builds the
// base template, minutes under TCG) and warms it with one create: the
// template's memory is imported as a base layer on first use.
func sharedNode(b *testing.B) *node {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root (network namespaces, taps)")
	}
	guestassets.Get(b)
	nodeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		var n *aenvdtest.Node
		n, nodeErr = aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "snbench", CIDRBase: 95, Env: []string{
			fmt.Sprintf("AENVD_GUEST_MEMORY_MIB=%d", guestMiB),
			"AENVD_NETWORK_POOL_LOW=2", "AENVD_NETWORK_POOL_HIGH=12",
		}})
		if nodeErr != nil {
			return
		}
		shared = &node{Node: n, hc: map[string]*http.Client{}}
		var id string
		if id, nodeErr = n.Create(`{"templateID":"base","timeout":300}`); nodeErr == nil {
			nodeErr = shared.kill(id)
		}
	})
	if nodeErr != nil {
		b.Fatalf("start aenvd: %v", nodeErr)
	}
	return shared
}

func (n *node) create(b *testing.B, template string) string {
	b.Helper()
	id, err := n.Create(`{"templateID":"` + template + `","timeout":1200}`)
	if err != nil {
		b.Fatal(err)
	}
	return id
}

func (n *node) kill(id string) error {
	code, body, _, err := n.Call("DELETE", "/sandboxes/"+id, n.Key, "")
	if err != nil || code != http.StatusNoContent {
		return fmt.Errorf("kill %s: %d %s %v", id, code, body, err)
	}
	return nil
}

func (n *node) mustKill(b *testing.B, ids ...string) {
	b.Helper()
	for _, id := range ids {
		if err := n.kill(id); err != nil {
			b.Error(err)
		}
	}
}

// expect calls the API and fails unless the status is want; it returns the
// body and the call's wall time.
func (n *node) expect(b *testing.B, want int, method, path, body string) ([]byte, time.Duration) {
	b.Helper()
	start := time.Now()
	code, out, _, err := n.Call(method, path, n.Key, body)
	took := time.Since(start)
	if err != nil || code != want {
		b.Fatalf("%s %s: %d %s %v (want %d)", method, path, code, out, err, want)
	}
	return out, took
}

// sh runs a bash script as root in sandbox id and returns its trimmed
// stdout; a non-zero exit fails the benchmark.
func (n *node) sh(b *testing.B, id, script string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := n.Sh(ctx, id, script)
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// fillScript writes up to want MiB of non-zero bytes (0xa5) into the
// guest's tmpfs, leaving 64 MiB of the guest's available memory free so
// nothing is OOM-killed, and prints the MiB written. /dev/shm is remounted
// to allow most of RAM (its default is half).
func fillScript(want int) string {
	return fmt.Sprintf(`set -e
mountpoint -q /dev/shm && mount -o remount,size=95%% /dev/shm
avail=$(awk '/^MemAvailable:/ {print int($2/1024)}' /proc/meminfo)
n=%d; [ $n -gt $((avail - 64)) ] && n=$((avail - 64))
python3 -c '
import sys
n = int(sys.argv[1]); page = bytes([0xa5]) * (1 << 20)
with open("/dev/shm/fill", "wb") as f:
    for _ in range(n):
        f.write(page)
' $n
echo $n`, want)
}

// checkFill verifies every byte of the tmpfs fill after a restore: n MiB
// of 0xa5.
const checkFill = `python3 -c '
n = 0
with open("/dev/shm/fill", "rb") as f:
    while True:
        c = f.read(1 << 20)
        if not c:
            break
        if c.count(0xa5) != len(c):
            raise SystemExit("fill corrupted at MiB %d" % n)
        n += 1
print(n)
'`

func (n *node) fill(b *testing.B, id string, mib int) int {
	b.Helper()
	got, err := strconv.Atoi(n.sh(b, id, fillScript(mib)))
	if err != nil || got <= 0 {
		b.Fatalf("sandbox %s: fill %d MiB: wrote %d (%v)", id, mib, got, err)
	}
	return got
}

func (n *node) checkFill(b *testing.B, id string, mib int) {
	b.Helper()
	if got := n.sh(b, id, checkFill); got != strconv.Itoa(mib) {
		b.Fatalf("sandbox %s: tmpfs fill reads back %s MiB, want %d MiB of 0xa5", id, got, mib)
	}
}

type snapshotJSON struct {
	SnapshotID   string `json:"snapshotID"`
	MemoryLayers int    `json:"memoryLayers"`
}

func (n *node) snapshot(b *testing.B, id string) snapshotJSON {
	b.Helper()
	out, _ := n.expect(b, http.StatusCreated, "POST", "/sandboxes/"+id+"/snapshots", `{}`)
	var s snapshotJSON
	if err := json.Unmarshal(out, &s); err != nil || s.SnapshotID == "" {
		b.Fatalf("snapshot %s: %s (%v)", id, out, err)
	}
	return s
}

// logLine is one aenvd log record (slog text format) as key/value pairs.
type logLine map[string]string

// logsSince returns the records with message msg logged after offset whose
// text contains every string of has.
func (n *node) logsSince(offset int, msg string, has ...string) []logLine {
	text := n.Logs()
	if offset > len(text) {
		offset = len(text)
	}
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(text[offset:]))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		for _, h := range has {
			if !strings.Contains(line, h) {
				continue next
			}
		}
		if l := parseLogLine(line); l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// parseLogLine splits `k=v k="quoted v"` pairs.
func parseLogLine(s string) logLine {
	l := logLine{}
	for s != "" {
		s = strings.TrimLeft(s, " ")
		k, rest, ok := strings.Cut(s, "=")
		if !ok {
			break
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := 1
			for end < len(rest) && (rest[end] != '"' || rest[end-1] == '\\') {
				end++
			}
			if uq, err := strconv.Unquote(rest[:min(end+1, len(rest))]); err == nil {
				v = uq
			} else {
				v = rest[1:min(end, len(rest))]
			}
			rest = rest[min(end+1, len(rest)):]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		l[k] = v
		s = rest
	}
	return l
}

func (l logLine) int(k string) int64 {
	v, _ := strconv.ParseInt(l[k], 10, 64)
	return v
}

func (l logLine) dur(k string) time.Duration {
	d, _ := time.ParseDuration(l[k])
	return d
}

// oneLog fails unless exactly one record matches.
func (n *node) oneLog(b *testing.B, offset int, msg string, has ...string) logLine {
	b.Helper()
	ls := n.logsSince(offset, msg, has...)
	if len(ls) != 1 {
		b.Fatalf("want one %q log record with %q since the operation, got %d:\n%s", msg, has, len(ls), n.Logs()[offset:])
	}
	return ls[0]
}

type sumCount struct{ sum, count float64 }

// stageSums reads the sums and counts of the stage histograms of op
// (create or resume) from /metrics, by stage.
func (n *node) stageSums(b *testing.B, op string) map[string]sumCount {
	b.Helper()
	text, err := n.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]sumCount{}
	label := fmt.Sprintf(`op="%s",stage="`, op)
	for _, line := range strings.Split(text, "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "aenvd_sandbox_stage_seconds_") {
			continue
		}
		i := strings.Index(name, label)
		if i < 0 {
			continue
		}
		stage, _, _ := strings.Cut(name[i+len(label):], `"`)
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		sc := out[stage]
		switch {
		case strings.HasPrefix(name, "aenvd_sandbox_stage_seconds_sum"):
			sc.sum = v
		case strings.HasPrefix(name, "aenvd_sandbox_stage_seconds_count"):
			sc.count = v
		}
		out[stage] = sc
	}
	return out
}

// stageMeans formats the mean of each stage observed between two reads.
func stageMeans(before, after map[string]sumCount) string {
	var parts []string
	for _, st := range []string{"network", "storage", "memory", "vmm_restore", "agent", "stop_vcpus", "capture_seal", "record", "stop_vmm", "release"} {
		d := sumCount{after[st].sum - before[st].sum, after[st].count - before[st].count}
		if d.count > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", st, secs(d.sum/d.count)))
		}
	}
	return strings.Join(parts, ", ")
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// timeline lists the log records since offset that mention id, with their
// time since start and their took/stream figures: the steps of one
// operation as aenvd saw them.
func (n *node) timeline(offset int, start time.Time, id string) string {
	text := n.Logs()
	if offset > len(text) {
		offset = len(text)
	}
	var parts []string
	for _, line := range strings.Split(text[offset:], "\n") {
		if !strings.Contains(line, id) {
			continue
		}
		l := parseLogLine(line)
		at, err := time.Parse(time.RFC3339Nano, l["time"])
		if err != nil || l["msg"] == "" {
			continue
		}
		p := fmt.Sprintf("%q +%s", l["msg"], ms(at.Sub(start)))
		if l["took"] != "" {
			p += " took " + l["took"]
		}
		if v := l.int("stream_bytes"); v > 0 {
			p += fmt.Sprintf(" streamed %.0f MiB", mib(v))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// say prints one result line (b.Log keeps only 10 lines of a benchmark).
func say(format string, args ...any) {
	fmt.Printf("    "+format+"\n", args...)
}

// memoryExports reports whether the node's VMs map memory from the storage
// daemon's shared exports (/nodes memory mode "block-export"), where
// nothing is flattened.
func (n *node) memoryExports(b *testing.B) bool {
	b.Helper()
	out, _ := n.expect(b, http.StatusOK, "GET", "/nodes", "")
	var nodes []struct {
		Memory struct {
			Mode string `json:"mode"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(out, &nodes); err != nil || len(nodes) != 1 {
		b.Fatalf("/nodes: %s (%v)", out, err)
	}
	return nodes[0].Memory.Mode == "block-export"
}
