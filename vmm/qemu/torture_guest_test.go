package qemu_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/panicscan"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// seedScript runs in the booted guest before its snapshot: 8 MiB of
// random bytes in tmpfs (guest RAM) whose sum every restore checks, and a
// loop kept running so the snapshot catches the guest busy. It prints the
// seed's sha256 and the clock source.
const seedScript = `head -c 8388608 /dev/urandom > /dev/shm/seed || exit 1; ` +
	`(nohup sh -c 'while :; do cat /proc/meminfo > /dev/null; sleep 0.02; done' > /dev/null 2>&1 &); ` +
	`sha256sum /dev/shm/seed | cut -d' ' -f1; cat /sys/devices/system/clocksource/clocksource0/current_clocksource`

// workloadScript runs in every restored guest. It sums the seed written
// before the snapshot; fills 8 MiB of fresh memory and sums it before and
// after churning the kernel's slab caches (socket pairs and loopback TCP
// connections carrying data, 500 small files, forked processes),
// counting every byte that came back wrong; then prints the kernel log's
// error and warning lines.
const workloadScript = `
import hashlib, os, socket, subprocess
sha = lambda b: hashlib.sha256(b).hexdigest()
print("seed", sha(open("/dev/shm/seed", "rb").read()))
data = os.urandom(8 << 20)
before = sha(data)
bad = 0
pairs = [socket.socketpair() for _ in range(100)]
for i, (a, b) in enumerate(pairs):
    msg = b"%d-" % i * 200
    a.sendall(msg)
    got = b""
    while len(got) < len(msg):
        got += b.recv(65536)
    bad += got != msg
for a, b in pairs:
    a.close(); b.close()
srv = socket.socket()
srv.bind(("127.0.0.1", 0)); srv.listen(64)
for i in range(30):
    c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()
    msg = b"%d+" % i * 4000
    c.sendall(msg)
    got = b""
    while len(got) < len(msg):
        got += s.recv(65536)
    bad += got != msg
    c.close(); s.close()
srv.close()
d = "/dev/shm/churn"
os.makedirs(d, exist_ok=True)
for i in range(500):
    with open("%s/f%d" % (d, i), "wb") as f:
        f.write(b"%d\n" % i * 20)
for i in range(500):
    bad += open("%s/f%d" % (d, i), "rb").read() != b"%d\n" % i * 20
    os.unlink("%s/f%d" % (d, i))
kids = []
for i in range(10):
    pid = os.fork()
    if pid == 0:
        os._exit(i)
    kids.append((pid, i))
for pid, i in kids:
    bad += os.WEXITSTATUS(os.waitpid(pid, 0)[1]) != i
print("data", before, sha(data))
print("bad", bad)
print(subprocess.run(["dmesg", "--level=emerg,alert,crit,err,warn"], capture_output=True, text=True).stdout)
`

// restoreResult is what one restore showed.
type restoreResult struct {
	ready   time.Duration // restore to agent answering
	work    time.Duration // the workload
	panic   string        // first lines of a crash report
	failure string        // a wrong byte or an unreachable guest without one
	next    *chainSnap    // the snapshot of this guest, for a cycle variant
}

// restoreOnce restores the snapshot dir (memory image memory), runs the
// workload and scans what the guest logged.
func (tr *torture) restoreOnce(v variant, bs *bootSnap, snap *chainSnap, i int) restoreResult {
	t := tr.t
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tn := bs.net
	mem := tr.memoryFor(v, snap.memory)
	if mem != snap.memory {
		defer os.Remove(mem)
	}
	rd := tr.runDir(v.name)
	defer os.RemoveAll(rd)
	start := time.Now()
	vm, err := tr.d.Restore(ctx, vmm.RestoreConfig{ID: fmt.Sprintf("torture-%d", i), SnapshotDir: snap.dir, MemoryFile: mem,
		MemoryLayers: snap.layers, RunDir: rd, NICs: []vmm.NIC{tn.NIC()}})
	if err != nil {
		t.Fatalf("%s restore %d: %v", v.name, i, err)
	}
	defer vm.Stop(context.Background())
	var res restoreResult
	if err := tn.WaitHealthy(ctx); err != nil {
		res.failure = fmt.Sprintf("agent unreachable after the restore: %v", err)
	} else {
		res.ready = time.Since(start)
		w := runWorkload(ctx, tn, bs.seed)
		res.work = time.Since(start) - res.ready
		res.failure, res.panic = w.failure, panicscan.Scan([]byte(w.kernelLog))
	}
	if p := panicscan.Scan(readConsole(vm)); p != "" {
		res.panic = p
	}
	if res.panic == "" && res.failure != "" {
		res.failure += "\nconsole:\n" + tailOf(readConsole(vm), 1500)
	}
	if v.cycle && res.panic == "" && res.failure == "" {
		res.next = tr.pauseSnapshot(ctx, v, bs, vm)
	}
	return res
}

// workloadResult is the workload's verdict and the guest's kernel log.
type workloadResult struct {
	failure   string
	kernelLog string
}

// runWorkload runs workloadScript in the guest and checks what it printed.
func runWorkload(ctx context.Context, tn *vmmtest.TestNet, seed string) workloadResult {
	out, err := guestRun(ctx, tn, "python3", "-c", workloadScript)
	if err != nil {
		return workloadResult{failure: fmt.Sprintf("workload: %v", err)}
	}
	var gotSeed, before, after, bad string
	lines := strings.SplitN(out, "\n", 4)
	if len(lines) >= 3 {
		fmt.Sscanf(lines[0], "seed %s", &gotSeed)
		fmt.Sscanf(lines[1], "data %s %s", &before, &after)
		fmt.Sscanf(lines[2], "bad %s", &bad)
	}
	w := workloadResult{}
	if len(lines) == 4 {
		w.kernelLog = lines[3]
	}
	switch {
	case gotSeed != seed:
		w.failure = fmt.Sprintf("the seed written before the snapshot sums %q, want %s", gotSeed, seed)
	case before == "" || before != after:
		w.failure = fmt.Sprintf("a buffer changed while the kernel churned its caches: %q then %q", before, after)
	case bad != "0":
		w.failure = fmt.Sprintf("%s socket, file or process checks came back wrong", bad)
	}
	return w
}

// guestRun runs a command in the guest and returns its trimmed stdout.
func guestRun(ctx context.Context, tn *vmmtest.TestNet, cmd string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, errOut, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, cmd, args...)
	if err != nil {
		return "", fmt.Errorf("guest command: %w", err)
	}
	if code != 0 {
		return "", fmt.Errorf("guest command: exit %d: %s", code, bytes.TrimSpace(errOut))
	}
	return strings.TrimSpace(string(out)), nil
}

// tortureTable renders the rows: restores, panics and failures per variant.
func tortureTable(rows []*tortureRow) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "variant\tmapping\tsnapshot\tcpu\ttcg\tclock\tvcpus\trestores\tpanics\tfailures\tmean ready\tmean workload")
	for _, r := range rows {
		v := r.v
		mapping, snap := "private", "boot"
		if v.shared {
			mapping = "shared"
		}
		if v.chained {
			snap = "chained"
		}
		if v.cycle {
			snap = "cycle"
		}
		if v.layers {
			snap = "cycle, layers"
		}
		mean := func(d time.Duration) time.Duration {
			return (d / time.Duration(max(r.restores, 1))).Round(10 * time.Millisecond)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%v\t%v\n", v.name, mapping, snap, orDefault(v.cpu, "max"),
			orDefault(v.tcg, "default"), r.clock+orDefault(" "+v.cmdline, ""), max(v.vcpus, 1), r.restores, r.panics, r.failures, mean(r.ready), mean(r.work))
	}
	w.Flush()
	return b.String()
}

func orDefault(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}
