package e2e

import (
	"context"
	"fmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/storage/blob"
)

const (
	lazyConfigsMetric  = "aenvd_rootfs_lazy_configs"
	wholeFetchedMetric = "aenvd_repository_layer_fetched_bytes_total"
	pushedMetric       = "aenvd_memory_workingset_prefetched_bytes_total"
	packMetric         = "aenvd_repository_workingset_pack_fetched_bytes_total"
)

// TestLazyResumeOverS3: two nodes share a bucket of a real S3 server
// (versitygw). A sandbox paused on A resumes on B before its rootfs layers
// are on B: what B fetched for the disk until the VM answered is a small
// part of the layers, the guest's files read back intact (its page cache
// dropped: read through B's layer socket), and once B fetched the layers in
// the background its device reads local files and the files still read
// intact. A layer object damaged in the bucket fails the guest's read with
// an I/O error (no byte of it served) and both B and its storage daemon log
// the layer's digest; a damaged memory layer fails the resume (or ends the
// VM, which keeps the disk) with the digest in the error, the sandbox's
// failure and the log: the guest never runs on wrong bytes. A crash of B after the fetch and another after the
// config names the files are each finished by the next start. Reads that
// find aenvd on B killed wait for its restart (lazyrestart_test.go).
func TestLazyResumeOverS3(t *testing.T) {
	nodePrereqs(t)
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	env := s3test.NodeEnv(bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	r, err := s3.Open(ctx, bucket, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := repoPeer(ctx, t, "adlza", 103, env...)
	b := repoPeer(ctx, t, "adlzb", 105, env...)

	t.Run("resume before the layers are here", func(t *testing.T) {
		id := a.create(t, `{"templateID":"base","timeout":300}`)
		data := a.writeData(t, id, "lazy")
		// 48 MiB in tmpfs: guest memory, which the pause's memory layer
		// carries and a lazy restore reads through the layer socket.
		shm := a.sh(t, id, `head -c 50331648 /dev/urandom > /dev/shm/lazy && sha256sum < /dev/shm/lazy`)
		a.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", a.key, "")
		m, err := r.Manifest(ctx, waitManifest(ctx, t, r, "sandbox-"+id+"-"))
		if err != nil {
			t.Fatal(err)
		}
		var rootfs, memory int64
		for _, l := range m.Rootfs {
			rootfs += l.Size
		}
		for _, l := range m.Memory {
			memory += l.Size
		}
		// What B fetched until the VM answered: chunks read lazily (by
		// use: the storage daemon's memory export, its disk), and layers
		// fetched whole (the memory layers on a node whose VMs map memory
		// files of their own; every layer on a node that is not lazy).
		lazy0, whole0, pushed0, pack0 := b.lazyCosts(t), b.metricValue(t, wholeFetchedMetric), b.metricValue(t, pushedMetric), b.metricValue(t, packMetric)
		b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":300}`)
		lazy := b.lazyCosts(t).since(lazy0)
		pushed := int64(b.metricValue(t, pushedMetric) - pushed0)
		pack := int64(b.metricValue(t, packMetric) - pack0)
		mem, disk := lazy[repo.UseMemory], lazy[repo.UseRootfs]
		fetched := mem.fetched + disk.fetched + pack + int64(b.metricValue(t, wholeFetchedMetric)-whole0)
		t.Logf("node B fetched %d KiB before the VM answered, of the %d MiB of rootfs layers and %d MiB of memory layers; lazily: memory %+v, rootfs %+v; a working-set pack of %d KiB; %d KiB of memory pushed ahead of the guest (the working set A's pause recorded)",
			fetched>>10, rootfs>>20, memory>>20, mem, disk, pack>>10, pushed>>10)
		if b.memoryExports(t) {
			// Memory is lazy too: what the restore touched, not the layers.
			if fetched >= (rootfs+memory)/4 {
				t.Fatalf("node B fetched %d of the %d bytes of rootfs and memory layers before the resume answered: not lazy", fetched, rootfs+memory)
			}
			// Memory: the blocks the guest's faults read (with the
			// mount's read-around) and the working set pushed ahead,
			// nothing else; the disk: the chunks read, read-ahead on
			// sequential reads and the working set.
			if mem.readAhead != 0 || mem.fetched > mem.read+mem.prefetched || mem.read == 0 {
				t.Fatalf("node B's lazy memory reads before the resume answered: %+v; want fetched <= read + working set, nothing read ahead", mem)
			}
			// The pause on A recorded the pages its VM held (the 48 MiB
			// in tmpfs among them) and committed their bytes as one pack
			// (at most memsnap.MaxPackData of them); B read it whole and
			// pushed its pages before the guest ran, with no layer read.
			if pushed < 48<<20 || pushed > memsnap.MaxPackData || pack < pushed || pack > pushed+memsnap.MaxWorkingSetBytes {
				t.Fatalf("node B read a pack of %d bytes and pushed %d bytes of the pause's working set ahead of the guest; want at least the 48 MiB in tmpfs pushed, at most %d, from a pack of them",
					pack, pushed, memsnap.MaxPackData)
			}
		} else if d := fetched - memory; d >= rootfs/4 {
			t.Fatalf("node B fetched %d of the rootfs layers' %d bytes before the resume answered: not lazy", d, rootfs)
		}
		if disk.fetched > disk.read+disk.readAhead+disk.prefetched {
			t.Fatalf("node B's lazy rootfs reads before the resume answered: %+v; want fetched <= read + read ahead + working set", disk)
		}
		checkShm := func(when string) {
			t.Helper()
			if got := b.sh(t, id, `sha256sum < /dev/shm/lazy`); got != shm {
				t.Fatalf("%s: tmpfs reads %q, want %q", when, got, shm)
			}
		}
		b.checkData(t, id, data)
		checkShm("resumed on B")
		b.waitLocal(t, id)
		b.checkData(t, id, data)
		// A pause on B captures the memory whose layers came lazily (local
		// files by now), and its resume maps the stack of local files.
		b.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", b.key, "")
		b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":300}`)
		checkShm("paused and resumed on B")
		b.checkData(t, id, data)
		b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
		a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")
	})

	t.Run("lazy reads wait across an aenvd restart", func(t *testing.T) { lazyReadsAcrossRestart(ctx, t, a, b, r) })

	t.Run("a damaged layer fails loudly", func(t *testing.T) {
		id, _, m := pausedOn(ctx, t, a, r, "damaged")
		top := m.Rootfs[len(m.Rootfs)-1] // the sandbox's own writes: its data set
		damageChunks(t, srv.ObjectPath(bucket.Bucket, repo.BlobKey(top.Digest)), top.Size)
		b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":300}`)
		out, code := b.try(t, id, `sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum /home/user/damaged/big`)
		if code == 0 || !strings.Contains(out, "Input/output error") {
			t.Fatalf("a read of a damaged layer: exit %d, %q (want an I/O error)", code, out)
		}
		if !strings.Contains(b.Logs(), string(top.Digest)) {
			t.Fatalf("node B's log does not name the damaged layer %s", top.Digest)
		}
		slog, _ := os.ReadFile(filepath.Join(b.DataDir, "storaged", "storaged.log"))
		if !strings.Contains(string(slog), "device read failed") || !strings.Contains(string(slog), top.Digest.Hex()) {
			t.Fatalf("the storage daemon's log does not name the damaged layer %s", top.Digest)
		}
		b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
		a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")
	})

	t.Run("a damaged memory layer fails the sandbox naming it", func(t *testing.T) { damagedMemory(ctx, t, srv, bucket.Bucket, a, b, r) })

	t.Run("crashes between the resume and the move", func(t *testing.T) {
		id, data, _ := pausedOn(ctx, t, a, r, "crashed")
		if err := b.Arm("orchestrator/lazy/fetched", "crash"); err != nil {
			t.Fatal(err)
		}
		b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":300}`)
		b.waitKilled(t, "orchestrator/lazy/fetched")
		// The start resumes the job, which now crashes once the config
		// names the files (before the devices moved).
		err := b.RestartWith(ctx, 3*time.Minute, failpoint.EnvVar+"=orchestrator/lazy/configured=crash")
		t.Logf("start with orchestrator/lazy/configured armed: %v", err)
		b.waitKilled(t, "orchestrator/lazy/configured")
		b.start(t)
		b.waitLocal(t, id)
		b.checkData(t, id, data)
		b.checkNoOrphans(t)
		b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
		a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")
	})
}

// waitKilled waits for aenvd to die of the crash at point.
func (n *node) waitKilled(t *testing.T, point string) {
	t.Helper()
	st, err := n.WaitExit(2 * time.Minute)
	if err != nil {
		t.Fatalf("crash at %s: %v\n%s", point, err, n.Logs())
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("aenvd ended with %v, want SIGKILL from %s\n%s", st, point, n.Logs())
	}
}

// pausedOn creates a sandbox of the base template on n, writes the data
// set tag into it, pauses it and waits for its pause's manifest.
func pausedOn(ctx context.Context, t *testing.T, n *node, r *repo.Repo, tag string) (string, guestData, *repo.Manifest) {
	t.Helper()
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, tag)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	m, err := r.Manifest(ctx, waitManifest(ctx, t, r, "sandbox-"+id+"-"))
	if err != nil {
		t.Fatal(err)
	}
	return id, data, m
}

// waitLocal waits until the node has no rootfs config left reading remote
// layers and sandbox id's device reads only files.
func (n *node) waitLocal(t *testing.T, id string) {
	t.Helper()
	sd := n.storaged(t)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var remote []string
		devs, err := sd.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		owned := 0
		for _, d := range devs {
			if d.Owner != id {
				continue
			}
			owned++
			for _, l := range d.Layers {
				if blob.IsURL(l) || !strings.HasPrefix(l, n.DataDir+"/") {
					remote = append(remote, l)
				}
			}
		}
		pending := n.metricValue(t, lazyConfigsMetric)
		if owned > 0 && len(remote) == 0 && pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: %d devices, still reading %v, %v configs pending\n%s", id, owned, remote, pending, n.Logs())
		}
		time.Sleep(time.Second)
	}
}

// try runs a bash script as root in sandbox id and returns its output
// (stdout and stderr) and exit code.
func (n *node) try(t *testing.T, id, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Transport: headerTransport{id, "49983"}}
	out, stderr, code, err := agentclient.RunWith(ctx, n.proxy, hc, []agentclient.Option{agentclient.WithUser("root")},
		"/bin/bash", "-c", script)
	if err != nil {
		t.Fatalf("sandbox %s: %q: %v", id, script, err)
	}
	return string(out) + string(stderr), code
}

// damageChunks flips a byte in every 256 KiB chunk of the object at path
// but its first and last two (the layer's header and index stay readable,
// so the disk opens and its data reads fail).
func damageChunks(t *testing.T, path string, size int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) != size {
		t.Fatalf("object %s: %d bytes, %v (want %d)", path, len(b), err, size)
	}
	const chunk = 256 << 10
	n := 0
	for off := int64(chunk); off+2*chunk < size; off += chunk {
		b[off+chunk/2] ^= 0xff
		n++
	}
	if n == 0 {
		t.Fatalf("layer of %d bytes: no chunk to damage", size)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(fmt.Errorf("damage %s: %w", path, err))
	}
}

// damageByte flips the byte at off of the object file at path.
func damageByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(fmt.Errorf("damage %s: %w", path, err))
	}
}

// damagedMemory: the memory layer of A's pause is damaged in the bucket
// (every chunk but the layer's header and index), and so is the pack of its
// working set (which holds good copies of the pages the sandbox wrote); B's
// restore reads the layer lazily, no source gives bytes that verify, and the
// VM cannot run on: the connect fails or the sandbox ends paused without its
// memory, and the error, the sandbox's failure and B's log name the layer's
// digest.
func damagedMemory(ctx context.Context, t *testing.T, srv *s3test.Server, bucket string, a, b *node, r *repo.Repo) {
	id, data, m := pausedOn(ctx, t, a, r, "dmem")
	top := m.Memory[len(m.Memory)-1] // the pause's own layer: the pages the sandbox wrote
	damageChunks(t, srv.ObjectPath(bucket, repo.BlobKey(top.Digest)), top.Size)
	if m.WorkingSet == nil {
		t.Fatal("A's pause committed no working-set pack")
	}
	damageByte(t, srv.ObjectPath(bucket, repo.BlobKey(m.WorkingSet.Digest)), m.WorkingSet.Size/2)
	code, body, _, err := b.Call("POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":300}`)
	if err != nil {
		t.Fatal(err)
	}
	digest := top.Digest.Hex()
	if code == http.StatusCreated {
		// The restore answered before the guest touched a damaged page:
		// the VM ends at its first one, and the sandbox is paused.
		b.waitState(t, id, "paused", 2*time.Minute)
	} else if !strings.Contains(string(body), digest) {
		t.Fatalf("connect of %s with a damaged memory layer: %d %s; want the layer %s named", id, code, body, top.Digest)
	}
	if why := b.failure(t, id); !strings.Contains(why, digest) {
		t.Fatalf("sandbox %s with a damaged memory layer: failure %q, want the layer %s named", id, why, top.Digest)
	}
	if !strings.Contains(b.Logs(), digest) {
		t.Fatalf("node B's log does not name the damaged memory layer %s", top.Digest)
	}
	t.Logf("connect answered %d; failure recorded: %s", code, b.failure(t, id))
	if code == http.StatusCreated {
		// Paused without its memory: the disk, written and synced before
		// A's pause, cold-boots.
		b.resumeAndCheck(t, id, data)
	}
	b.call(t, "DELETE", "/sandboxes/"+id, b.key, "")
	a.call(t, "DELETE", "/sandboxes/"+id, a.key, "")
}

// lazyCost is what a node's lazy reads of one use of layers cost (its
// aenvd_repository_lazy_*_bytes_total metrics).
type lazyCost struct{ fetched, read, readAhead, prefetched int64 }

// lazyCosts are lazyCost by use (repo.UseRootfs, repo.UseMemory).
type lazyCosts map[string]lazyCost

// lazyCosts reads n's lazy read costs by use.
func (n *node) lazyCosts(t *testing.T) lazyCosts {
	t.Helper()
	out := lazyCosts{}
	for _, use := range []string{repo.UseRootfs, repo.UseMemory} {
		v := func(what string) int64 {
			return int64(n.metricValue(t, fmt.Sprintf(`aenvd_repository_lazy_%s_bytes_total{use=%q}`, what, use)))
		}
		out[use] = lazyCost{fetched: v("fetched"), read: v("read"), readAhead: v("readahead"), prefetched: v("prefetched")}
	}
	return out
}

// since is what was spent after before.
func (c lazyCosts) since(before lazyCosts) lazyCosts {
	out := lazyCosts{}
	for use, v := range c {
		b := before[use]
		out[use] = lazyCost{fetched: v.fetched - b.fetched, read: v.read - b.read,
			readAhead: v.readAhead - b.readAhead, prefetched: v.prefetched - b.prefetched}
	}
	return out
}
