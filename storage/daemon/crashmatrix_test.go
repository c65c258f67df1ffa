package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/nbd"
)

// crashRun is one daemon process (restarted after a crash) driven through
// a fixed scenario, with a model of the first device's content.
type crashRun struct {
	t   *testing.T
	ctx context.Context
	dir string
	fx  *fixture
	ls  *layerServer // serves fx's base layer by URL
	log *os.File

	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit, once done is closed

	c     *client.Client
	a     rpc.Device // the device written to; ID 0 until created
	haveA bool
	want  []byte // a's content as of its last flush
	b     rpc.Device
	lazy  rpc.Device // a device whose lower is a URL, then a file
	seals int        // kept seals tried (each writes a layer of its own)
	kept  []string   // the last kept seal's stack
}

// checkReads compares dev's bytes through its export with the stack of
// layers opened directly.
func (r *crashRun) checkReads(dev rpc.Device, layers []string) error {
	want, err := image.OpenLayers(r.ctx, layers, image.Options{})
	if err != nil {
		return err
	}
	defer want.Close()
	nc, err := nbd.Dial(r.ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		return err
	}
	defer nc.Close()
	if !bytes.Equal(readAll(r.t, nc, diskSize), readAll(r.t, want, diskSize)) {
		return fmt.Errorf("device %d does not read as %v", dev.ID, layers)
	}
	return nil
}

// newCrashRun makes a run in a fresh directory (a minute to finish) with
// the daemon's log in it; the daemon is started by spawn.
func newCrashRun(t *testing.T, fx *fixture, ls *layerServer) *crashRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	log, err := os.Create(filepath.Join(dir, "storaged.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	return &crashRun{t: t, ctx: ctx, dir: dir, fx: fx, ls: ls, log: log, want: slices.Clone(fx.want)}
}

func (r *crashRun) spawn(failpoints string) {
	r.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+r.dir, failpoint.EnvVar+"="+failpoints)
	cmd.Stderr = r.log
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	r.cmd, r.done = cmd, done
	go func() { r.err = cmd.Wait(); close(done) }()
	r.t.Cleanup(func() { cmd.Process.Kill(); <-done })
	sock := filepath.Join(r.dir, "run", "storaged.sock")
	for r.c == nil {
		if c, err := client.Dial(r.ctx, sock); err == nil {
			r.c = c
			r.t.Cleanup(func() { c.Close() })
			break
		}
		select {
		case <-done:
			r.t.Fatalf("daemon exited at start: %v\n%s", r.err, r.logText())
		case <-r.ctx.Done():
			r.t.Fatal("daemon did not come up")
		case <-time.After(10 * time.Millisecond):
		}
	}
	// A client from before the crash redials the new daemon by itself.
	for {
		if _, err := r.c.Features(r.ctx); err == nil {
			return
		}
		select {
		case <-done:
			r.t.Fatalf("daemon exited at start: %v\n%s", r.err, r.logText())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *crashRun) logText() string {
	b, _ := os.ReadFile(r.log.Name())
	return string(b)
}

// crashed says whether the process died of SIGKILL (a crash failpoint).
func (r *crashRun) crashed() bool {
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		return false
	}
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// write writes s at off on device a through its NBD export and flushes;
// the model changes only once the flush is acknowledged.
func (r *crashRun) write(off int64, s string) error {
	nc, err := nbd.Dial(r.ctx, "unix", r.a.Socket, r.a.Export)
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := nc.WriteAt([]byte(s), off); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	copy(r.want[off:], s)
	return nil
}

// checkA reads device a through its export and compares it with the model.
func (r *crashRun) checkA(when string) {
	r.t.Helper()
	if !r.haveA {
		return
	}
	nc, err := nbd.Dial(r.ctx, "unix", r.a.Socket, r.a.Export)
	if err != nil {
		r.t.Fatalf("%s: device %d not exported: %v", when, r.a.ID, err)
	}
	defer nc.Close()
	if got := readAll(r.t, nc, diskSize); !bytes.Equal(got, r.want) {
		r.t.Fatalf("%s: device %d lost flushed writes", when, r.a.ID)
	}
}

type crashStep struct {
	name string
	run  func(r *crashRun) error
}

// crashScenario touches every storaged failpoint: each step is safe to run
// again after a crash cut it short (the point of the matrix).
var crashScenario = []crashStep{
	{"create", func(r *crashRun) error {
		dev, err := r.c.Create(r.ctx, rpc.CreateParams{Image: r.fx.config, Owner: "t"})
		if err == nil {
			r.a, r.haveA = dev, true
		}
		return err
	}},
	{"write", func(r *crashRun) error { return r.write(4096, "before the restack") }},
	{"restack", func(r *crashRun) error {
		_, err := r.c.Restack(r.ctx, rpc.RestackParams{ID: r.a.ID})
		return err
	}},
	{"write again", func(r *crashRun) error { return r.write(2<<20, "after the restack") }},
	{"seal keeping the upper", func(r *crashRun) error {
		r.seals++
		layer := filepath.Join(r.dir, fmt.Sprintf("kept-%d.lsmt", r.seals))
		res, err := r.c.Restack(r.ctx, rpc.RestackParams{ID: r.a.ID, Layer: layer, Keep: true})
		if err != nil {
			return err
		}
		sealed, err := image.OpenLayers(r.ctx, res.Layers, image.Options{})
		if err != nil {
			return err
		}
		defer sealed.Close()
		if got := readAll(r.t, sealed, diskSize); !bytes.Equal(got, r.want) {
			return fmt.Errorf("the kept seal's stack %v does not read as the device", res.Layers)
		}
		r.kept = res.Layers
		return r.write(1<<20, "after the kept seal")
	}},
	{"create on a URL", func(r *crashRun) error {
		dev, err := r.c.Create(r.ctx, rpc.CreateParams{Image: r.ls.config, Owner: "t"})
		r.lazy = dev
		return err
	}},
	{"localize", func(r *crashRun) error {
		dev, err := r.c.Localize(r.ctx, rpc.LocalizeParams{ID: r.lazy.ID, Lowers: []rpc.LocalLower{{URL: r.ls.url, File: r.fx.base}}})
		if err != nil {
			return err
		}
		if len(dev.Layers) != 1 || dev.Layers[0] != r.fx.base {
			return fmt.Errorf("localized device reads %v", dev.Layers)
		}
		nc, err := nbd.Dial(r.ctx, "unix", dev.Socket, dev.Export)
		if err != nil {
			return err
		}
		defer nc.Close()
		if got := readAll(r.t, nc, diskSize); !bytes.Equal(got, r.fx.want) {
			return fmt.Errorf("localized device %d reads other bytes", dev.ID)
		}
		return nil
	}},
	{"shared", func(r *crashRun) error {
		sh, err := r.c.AcquireShared(r.ctx, r.fx.config, "t/vm1")
		if err == nil {
			_, err = r.c.AcquireShared(r.ctx, r.fx.config, "t/vm2")
		}
		if err == nil {
			err = r.c.ReleaseShared(r.ctx, sh.ID, "t/vm2")
		}
		if errors.Is(err, rpc.ErrNotFound) {
			err = nil // released before a crash cut the answer
		}
		return err
	}},
	{"warm", func(r *crashRun) error {
		if err := r.c.Warm(r.ctx, rpc.WarmParams{Image: r.fx.config, Low: 1, High: 1}); err != nil {
			return err
		}
		for {
			devs, err := r.c.List(r.ctx)
			if err != nil {
				return err
			}
			if slices.ContainsFunc(devs, func(d rpc.Device) bool { return d.Kind == rpc.KindPool }) {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
	}},
	{"claim", func(r *crashRun) error {
		dev, err := r.c.Create(r.ctx, rpc.CreateParams{Image: r.fx.config, Owner: "t"})
		r.b = dev
		return err
	}},
	{"rebase", func(r *crashRun) error {
		if len(r.kept) == 0 {
			return errors.New("no kept seal to rebase onto")
		}
		cfg := &image.Config{}
		for _, l := range r.kept {
			cfg.Lowers = append(cfg.Lowers, image.LayerRef{File: l})
		}
		path := filepath.Join(r.dir, "rebase.json")
		if err := cfg.Save(path); err != nil {
			return err
		}
		dev, err := r.c.Rebase(r.ctx, rpc.RebaseParams{ID: r.b.ID, Image: path})
		if err != nil {
			return err
		}
		return r.checkReads(dev, r.kept)
	}},
	{"delete", func(r *crashRun) error {
		if err := r.c.Delete(r.ctx, r.b.ID); err != nil && !errors.Is(err, rpc.ErrNotFound) {
			return err
		}
		return nil
	}},
	{"reclaim", func(r *crashRun) error {
		if _, err := r.c.Create(r.ctx, rpc.CreateParams{Image: r.fx.config, Owner: "t"}); err != nil {
			return err
		}
		_, err := r.c.Reclaim(r.ctx, "t", r.a.ID)
		return err
	}},
}

// TestCrashMatrix kills the daemon at each storaged failpoint in turn (a
// separate process per point), restarts it and checks that the device
// holds every flushed write, that nothing is left that no record owns,
// and that the cut operation and the rest of the scenario then succeed.
// Its FUSE row, a kill while a child maps a shared memory file, is
// TestCrashFUSEMapping (fusecrash_test.go).
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	fx := newFixture(t, 31)
	ls := fx.serveBase(t)
	points := failpoint.Names("storaged/")
	if len(points) < 15 {
		t.Fatalf("storaged failpoints: %v", points)
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			r := newCrashRun(t, fx, ls)
			ctx, dir := r.ctx, r.dir
			r.spawn(point + "=crash")
			cut := ""
			for k := 0; k < len(crashScenario); k++ {
				step := crashScenario[k]
				err := step.run(r)
				if err == nil {
					continue
				}
				if cut != "" || !r.crashed() {
					t.Fatalf("step %s: %v (crash already at %q)\n%s", step.name, err, cut, r.logText())
				}
				cut = step.name
				r.spawn("")
				devs := r.list()
				r.checkA("after the crash in " + cut)
				checkNoOrphans(t, filepath.Join(dir, "state"), filepath.Join(dir, "run"), devs)
				k-- // the cut step again
			}
			if cut == "" {
				t.Fatalf("failpoint %s never fired", point)
			}
			devs := r.list()
			r.checkA("at the end")
			checkNoOrphans(t, filepath.Join(dir, "state"), filepath.Join(dir, "run"), devs)
			for _, d := range devs {
				if d.Kind != rpc.KindPool && d.ID != r.a.ID {
					t.Errorf("device left after reclaim: %+v", d)
				}
			}
			if err := r.c.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			<-r.done
			if r.err != nil {
				t.Fatalf("daemon exit after shutdown: %v", r.err)
			}
		})
	}
}

// list returns every device once the warm pool (if configured: high
// watermark 1) is full, so no refill changes the state directory while it
// is checked; it fails on a lost device: a crash must never leave a device
// unservable.
func (r *crashRun) list() []rpc.Device {
	r.t.Helper()
	_, err := os.Stat(filepath.Join(r.dir, "state", "pool.json"))
	pooled := err == nil
	for {
		devs, err := r.c.List(r.ctx)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, d := range devs {
			if d.State != rpc.StateActive {
				r.t.Fatalf("device %d is %s after a crash: %s", d.ID, d.State, d.LostReason)
			}
		}
		n := 0
		for _, d := range devs {
			if d.Kind == rpc.KindPool {
				n++
			}
		}
		if n > 1 {
			r.t.Fatalf("pool past its high watermark: %+v", devs)
		}
		if !pooled || n == 1 {
			return devs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// genConfigName: image.GEN.json, or image.GEN.NONCE.json once a localize
// moved lowers to files.
var genConfigName = regexp.MustCompile(`^image\.([0-9]+)(\.[0-9a-f]{8})?\.json$`)

// checkNoOrphans checks that the state and run directories hold exactly what the listed devices own: each device's record, config, upper
// and sealed layers, the state lock and pool config, the RPC socket and one
// export socket per device. Derived from the device list, not from the
// daemon's own idea of what it owns.
func checkNoOrphans(t *testing.T, state, run string, devs []rpc.Device) {
	t.Helper()
	want := map[string]bool{filepath.Join(state, "lock"): true}
	optional := map[string]bool{filepath.Join(state, "pool.json"): true}
	sockets := []string{"storaged.sock"}
	for _, d := range devs {
		ddir := filepath.Join(state, "devices", fmt.Sprint(d.ID))
		want[filepath.Join(ddir, "device.json")] = true
		if filepath.Dir(d.Config) == ddir {
			want[d.Config] = true
			m := genConfigName.FindStringSubmatch(filepath.Base(d.Config))
			if m == nil {
				t.Fatalf("device %d serves %s", d.ID, d.Config)
			}
			if !d.ReadOnly {
				want[filepath.Join(ddir, "upper."+m[1]+".data")] = true
				want[filepath.Join(ddir, "upper."+m[1]+".index")] = true
				optional[lsmt.JournalPath(filepath.Join(ddir, "upper."+m[1]+".index"))] = true
			}
		}
		for _, l := range d.Layers {
			if strings.HasPrefix(l, ddir+"/") {
				want[l] = true
			}
		}
		sockets = append(sockets, fmt.Sprintf("nbd-%d.sock", d.ID))
	}
	err := filepath.WalkDir(state, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		if !want[p] && !optional[p] {
			t.Errorf("orphan file %s", p)
		}
		delete(want, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range want {
		t.Errorf("a device's file is missing: %s", p)
	}
	entries, err := os.ReadDir(run)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(sockets)
	if !slices.Equal(got, sockets) {
		t.Errorf("run directory holds %v, want %v", got, sockets)
	}
}
