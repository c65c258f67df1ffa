package repositorybench

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
)

// BenchmarkResumeOnAnotherNode: four aenvd nodes share one versitygw
// bucket. A sandbox that wrote 32 MiB is paused on node A and resumed there
// (from its local layers), paused again, and then resumed on node B, which
// brings it from the repository and starts it before its rootfs layers are
// there (lazy_rootfs, the default; its memory too where its VMs map the
// storage daemon's memory exports, the default), and on node C, which
// fetches every layer whole first (lazy_rootfs false). Then another
// sandbox of the template, paused on A, resumes on node D, lazily, with the
// working-set hints B recorded for the layers it read (the template's;
// the new pause's layers have none). Printed: the resumes' medians and the
// ratios of B's, C's and D's to A's, and the bytes B
// fetched before its resume answered (from its metrics) against
// the manifest's layer bytes. It boots VMs: run it alone (the VM lock),
// with -benchtime 1x or a few.
func BenchmarkResumeOnAnotherNode(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root (network namespaces, taps)")
	}
	if _, ok := s3test.Binary(); !ok {
		b.Skip("versitygw is not installed (run .ci/setup.d/60-versitygw.sh)")
	}
	guestassets.Get(b)
	srv := s3test.Start(b)
	bucket := srv.Bucket(b)
	env := s3test.NodeEnv(bucket)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	r, err := s3.Open(ctx, bucket, repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	start := func(prefix string, cidr int, extra ...string) *aenvdtest.Node {
		n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: prefix, CIDRBase: cidr, Env: append(slices.Clone(env), extra...)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { n.Close() })
		return n
	}
	na, nb := start("rbenca", 99), start("rbencb", 101)
	nc := start("rbencc", 107, "AENVD_REPOSITORY_LAZY_ROOTFS=false")
	nd := start("rbencd", 111)
	var local, lazy, whole, hinted []float64
	var before, beforeLazy, beforeMem, pushed, packed, total, wholeFetched int64
	b.ResetTimer()
	for range b.N {
		id, err := na.Create(`{"templateID":"base","timeout":600}`)
		if err != nil {
			b.Fatal(err)
		}
		run(ctx, b, na, id, "head -c 32M /dev/urandom > /home/user/blob && sync")
		call(b, na, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", "")
		local = append(local, call(b, na, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`).Seconds())
		call(b, na, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", "")
		m := newestPause(ctx, b, r, id, 2) // both pauses of this round
		for _, l := range append(m.Rootfs, m.Memory...) {
			total += l.Size
		}
		// B: the rootfs, and the memory where its VMs map the storage
		// daemon's exports (the default), read lazily until the
		// background fetch (after the VM answered); else the memory
		// layers whole first. Both counted from B's metrics.
		lazyBefore := metric(b, nb, "aenvd_repository_lazy_fetched_bytes_total")
		memBefore := metric(b, nb, `aenvd_repository_lazy_fetched_bytes_total{use="memory"}`)
		wholeBefore := metric(b, nb, "aenvd_repository_layer_fetched_bytes_total")
		pushedBefore, packBefore := metric(b, nb, pushedMetric), metric(b, nb, packMetric)
		lazy = append(lazy, call(b, nb, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`).Seconds())
		read := int64(metric(b, nb, "aenvd_repository_lazy_fetched_bytes_total") - lazyBefore)
		beforeLazy += read
		beforeMem += int64(metric(b, nb, `aenvd_repository_lazy_fetched_bytes_total{use="memory"}`) - memBefore)
		pack := int64(metric(b, nb, packMetric) - packBefore)
		before += read + pack + int64(metric(b, nb, "aenvd_repository_layer_fetched_bytes_total")-wholeBefore)
		pushed += int64(metric(b, nb, pushedMetric) - pushedBefore)
		packed += pack
		run(ctx, b, nb, id, "test $(stat -c %s /home/user/blob) = 33554432")
		// C: every layer whole before the VM starts.
		whole = append(whole, call(b, nc, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`).Seconds())
		run(ctx, b, nc, id, "test $(stat -c %s /home/user/blob) = 33554432")
		wholeFetched += dirBytes(filepath.Join(nc.DataDir, "sandboxes", id, "layers"))
		call(b, nc, http.StatusNoContent, "DELETE", "/sandboxes/"+id, "")
		call(b, nb, http.StatusNoContent, "DELETE", "/sandboxes/"+id, "")
		call(b, na, http.StatusNoContent, "DELETE", "/sandboxes/"+id, "")
		// D: another sandbox of the template, resumed lazily on a node
		// that finds the working-set hints B recorded for the layers it
		// read (all but this sandbox's own pause layers).
		hinted = append(hinted, resumeHinted(ctx, b, r, na, nb, nd))
	}
	b.StopTimer()
	for _, line := range strings.Split(nb.Logs(), "\n") {
		if strings.Contains(line, "pushed ahead of the guest") {
			fmt.Println("node B:", line)
		}
	}
	keepLogs(b, map[string]*aenvdtest.Node{"a": na, "b": nb, "c": nc, "d": nd})
	l, lz, wh, hn := median(local), median(lazy), median(whole), median(hinted)
	b.ReportMetric(lz/l, "lazy-remote/local")
	b.ReportMetric(wh/l, "whole-remote/local")
	b.ReportMetric(hn/l, "hinted-remote/local")
	fmt.Printf("resume on node D from the repository with the layers' working-set hints B recorded: median %.2fs (%.2fx A's)\n", hn, hn/l)
	fmt.Printf("resume on node A from local layers: median %.2fs; on node B from the repository, rootfs lazy: median %.2fs (%.2fx A's); "+
		"on node C, every layer fetched first: median %.2fs (%.2fx A's)\n", l, lz, lz/l, wh, wh/l)
	fmt.Printf("node B fetched %d MiB before its resume answered (read lazily: %d KiB, %d KiB of it memory; the working-set packs A's pauses committed: %d KiB, %d KiB of memory pushed ahead of the guest; the rest whole; a background fetch that started as the VM answered counts too) of the manifests' %d MiB of layers (%.3f); node C %d MiB (%.3f)\n",
		before>>20, beforeLazy>>10, beforeMem>>10, packed>>10, pushed>>10, total>>20, float64(before)/float64(max(total, 1)), wholeFetched>>20, float64(wholeFetched)/float64(max(total, 1)))
}

// keepLogs writes the nodes' logs into $AENV_BENCH_LOGS (when set), one
// file per node, for a look at where a resume's time went.
func keepLogs(b *testing.B, nodes map[string]*aenvdtest.Node) {
	dir := os.Getenv("AENV_BENCH_LOGS")
	if dir == "" {
		return
	}
	for name, n := range nodes {
		if err := os.WriteFile(filepath.Join(dir, "node-"+name+".log"), []byte(n.Logs()), 0o644); err != nil {
			b.Errorf("keep the log of node %s: %v", name, err)
		}
	}
}

// pushedMetric counts the bytes of memory working sets a node pushed into
// the page cache while VMs restored.
const pushedMetric = "aenvd_memory_workingset_prefetched_bytes_total"

// packMetric counts the bytes of working-set packs a node read.
const packMetric = "aenvd_repository_workingset_pack_fetched_bytes_total"

// metric reads a counter or gauge from a node's /metrics: the sum of its
// series (every label set), or one series when name has labels.
func metric(b *testing.B, n *aenvdtest.Node, name string) float64 {
	b.Helper()
	text, err := n.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	found := false
	for _, l := range strings.Split(text, "\n") {
		// name is a metric's name (every series) or a name with labels.
		if !strings.HasPrefix(l, name+" ") && (strings.Contains(name, "{") || !strings.HasPrefix(l, name+"{")) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			b.Fatalf("metric line %q: %v", l, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		b.Fatalf("node %s has no metric %s", n.API, name)
	}
	return sum
}

// call sends a control API request, fails unless the status is want and
// returns its wall time.
func call(b *testing.B, n *aenvdtest.Node, want int, method, path, body string) time.Duration {
	b.Helper()
	start := time.Now()
	code, out, _, err := n.Call(method, path, n.Key, body)
	if err != nil || code != want {
		b.Fatalf("%s %s: %d %s %v (want %d)", method, path, code, out, err, want)
	}
	return time.Since(start)
}

// run runs a shell script in the sandbox as root, failing on a non-zero exit.
func run(ctx context.Context, b *testing.B, n *aenvdtest.Node, id, script string) {
	b.Helper()
	if _, err := n.Sh(ctx, id, script); err != nil {
		b.Fatal(err)
	}
}

// newestPause waits until the repository holds want pauses of the sandbox
// and returns the newest one's manifest.
func newestPause(ctx context.Context, b *testing.B, r *repo.Repo, id string, want int) *repo.Manifest {
	b.Helper()
	for {
		names, err := r.Manifests(ctx)
		if err != nil {
			b.Fatal(err)
		}
		best, bestGen, gens := "", -1, 0
		prefix := "sandbox-" + id + "-"
		for _, n := range names {
			g, err := strconv.Atoi(strings.TrimPrefix(n, prefix))
			if err != nil || !strings.HasPrefix(n, prefix) {
				continue
			}
			if gens++; g > bestGen {
				best, bestGen = n, g
			}
		}
		if gens >= want {
			m, err := r.Manifest(ctx, best)
			if err != nil {
				b.Fatal(err)
			}
			return m
		}
		if ctx.Err() != nil {
			b.Fatalf("the pauses of %s are not in the repository (%d of %d)", id, gens, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dirBytes sums the sizes of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if st, err := d.Info(); err == nil {
				n += st.Size()
			}
		}
		return nil
	})
	return n
}

// resumeHinted pauses a new sandbox of the base template on a (32 MiB
// written, as the first) once b's lazily read layers are local (their
// working-set hints recorded), resumes it on d and returns that resume's
// wall time.
func resumeHinted(ctx context.Context, b *testing.B, r *repo.Repo, na, nb, nd *aenvdtest.Node) float64 {
	b.Helper()
	for i := 0; metric(b, nb, "aenvd_rootfs_lazy_configs") > 0; i++ {
		if i > 600 {
			b.Fatal("node B's lazily read layers did not become local in 5 minutes")
		}
		time.Sleep(500 * time.Millisecond)
	}
	id, err := na.Create(`{"templateID":"base","timeout":600}`)
	if err != nil {
		b.Fatal(err)
	}
	run(ctx, b, na, id, "head -c 32M /dev/urandom > /home/user/blob && sync")
	call(b, na, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", "")
	newestPause(ctx, b, r, id, 1) // committed: D can bring it
	t := call(b, nd, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`).Seconds()
	run(ctx, b, nd, id, "test $(stat -c %s /home/user/blob) = 33554432")
	call(b, nd, http.StatusNoContent, "DELETE", "/sandboxes/"+id, "")
	call(b, na, http.StatusNoContent, "DELETE", "/sandboxes/"+id, "")
	return t
}
