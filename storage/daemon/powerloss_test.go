package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/crashdisk"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// powerLoss is a daemon whose state directory lives on a crashdisk, with a
// model of the device's content as of its last flush.
type powerLoss struct {
	t    *testing.T
	disk *crashdisk.Disk
	h    *harness
	dev  rpc.Device
	want []byte
}

func newPowerLoss(t *testing.T) *powerLoss {
	disk := crashdisk.New(t, 256)
	root := disk.Root()
	fx := newFixture(t, 21)
	// The template lives on the disk too, durably: only the daemon's own
	// writes are under test.
	cfg := filepath.Join(root, "image.json")
	for _, f := range []struct{ dst, src string }{{filepath.Join(root, "base.lsmt"), fx.base}, {cfg, fx.config}} {
		if err := atomicfile.CopyFile(f.dst, f.src, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts := testOptions(t)
	opts.StateDir = filepath.Join(root, "state")
	h := start(t, opts)
	dev, err := h.c.Create(ctxT(t), rpc.CreateParams{Image: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return &powerLoss{t: t, disk: disk, h: h, dev: dev, want: slices.Clone(fx.want)}
}

// write writes s at off through NBD and flushes.
func (p *powerLoss) write(off int64, s string) {
	p.t.Helper()
	nc := dialDev(p.t, p.dev)
	if _, err := nc.WriteAt([]byte(s), off); err != nil {
		p.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		p.t.Fatal(err)
	}
	copy(p.want[off:], s)
	nc.Close()
}

// check cuts the power now and checks that the device record on the
// surviving disk names a config, layers and upper that are complete and
// together hold every flushed write. It returns the surviving disk's root.
func (p *powerLoss) check(when string) string {
	p.t.Helper()
	live := p.disk.Root()
	cut := p.disk.Crash()
	defer p.t.Logf("%s: power cut checked", when)
	moved := func(path string) string { return strings.Replace(path, live, cut, 1) }
	dir := filepath.Join(cut, "state", "devices", "0")
	b, err := os.ReadFile(filepath.Join(dir, "device.json"))
	if err != nil {
		p.t.Fatalf("%s: power loss: record: %v", when, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		p.t.Fatalf("%s: power loss: record %q: %v", when, b, err)
	}
	cfg, err := image.LoadConfig(moved(r.Config))
	if err != nil {
		p.t.Fatalf("%s: power loss: the record names config %s: %v", when, r.Config, err)
	}
	for i := range cfg.Lowers {
		cfg.Lowers[i].File = moved(cfg.Lowers[i].File)
	}
	im, err := image.OpenConfig(context.Background(), cfg, filepath.Dir(moved(r.Config)), image.Options{ReadOnly: true})
	if err != nil {
		p.t.Fatalf("%s: power loss: open the image the record names (gen %d): %v", when, r.Gen, err)
	}
	defer im.Close()
	got := readAll(p.t, im, diskSize)
	if !bytes.Equal(got, p.want) {
		i := 0
		for i < len(got) && got[i] == p.want[i] {
			i++
		}
		p.t.Fatalf("%s: power loss: gen %d differs from the flushed writes at byte %d", when, r.Gen, i)
	}
	return cut
}

// restartOn stops the daemon and starts one on the surviving disk cut
// (mounted over the live root, so the record's paths lead there): it must
// finish or roll back what was in progress, serve the device with every
// flushed write and leave nothing its records do not own. Then the live
// disk and its daemon come back.
func (p *powerLoss) restartOn(cut, when string) {
	p.t.Helper()
	live, opts := p.disk.Root(), p.h.opts
	p.h.stop()
	mount(p.t, "--bind", cut, live)
	bound := true
	p.t.Cleanup(func() { // a failing check must not leave the bind over the live disk
		if bound {
			exec.Command("umount", "-l", live).Run()
		}
	})
	h := start(p.t, opts)
	devs, err := h.c.List(ctxT(p.t))
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive {
		p.t.Fatalf("%s: after the power cut: %+v %v", when, devs, err)
	}
	if got := readAll(p.t, dialDev(p.t, devs[0]), diskSize); !bytes.Equal(got, p.want) {
		p.t.Fatalf("%s: the recovered device lost flushed writes", when)
	}
	checkNoOrphans(p.t, opts.StateDir, opts.RunDir, devs)
	h.stop()
	mount(p.t, "-u", live)
	bound = false
	p.h = start(p.t, opts)
}

// mount runs mount (or umount with "-u" first).
func mount(t *testing.T, args ...string) {
	t.Helper()
	name := "mount"
	if args[0] == "-u" {
		name, args = "umount", args[1:]
	}
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// TestPowerLossRestack cuts the power after each step of a device's life
// (create, flushed writes, restacks into the state directory and to a path
// of the caller's) and checks that the record always names complete files
// holding every flushed write.
func TestPowerLossRestack(t *testing.T) {
	p := newPowerLoss(t)
	p.check("after create")
	p.write(4096, "before the first restack")
	p.check("after a flushed write")
	if _, err := p.h.c.Restack(ctxT(t), rpc.RestackParams{ID: p.dev.ID}); err != nil {
		t.Fatal(err)
	}
	p.check("after a restack")
	p.write(3<<20, "before the second restack")
	outside := filepath.Join(p.disk.Root(), "exported", "layer.lsmt")
	if err := os.MkdirAll(filepath.Dir(outside), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := p.h.c.Restack(ctxT(t), rpc.RestackParams{ID: p.dev.ID, Layer: outside}); err != nil {
		t.Fatal(err)
	}
	p.restartOn(p.check("after a restack to the caller's path"), "after a restack to the caller's path")
	p.write(5<<20, "after the restacks")
	p.check("after the last write")
}

// TestPowerLossDuringRestack stops a restack at each of its steps, cuts the
// power there and checks the surviving record, then lets it finish.
// Not parallel: the step hook is global.
func TestPowerLossDuringRestack(t *testing.T) {
	p := newPowerLoss(t)
	points := failpoint.Names("storaged/restack/")
	if len(points) < 5 {
		t.Fatalf("restack failpoints: %v", points)
	}
	for i, name := range points {
		t.Run(name, func(t *testing.T) {
			p.write(int64(i)<<20+512, "before "+name)
			reached, resume := stopAt(t, name)
			done := make(chan error, 1)
			go func() {
				_, err := p.h.c.Restack(ctxT(t), rpc.RestackParams{ID: p.dev.ID})
				done <- err
			}()
			<-reached
			cut := p.check("stopped at " + name)
			// The intent is on the surviving disk, for the restart to act on.
			if _, err := os.Stat(filepath.Join(cut, "state", "devices", "0", journalName)); err != nil {
				t.Fatalf("stopped at %s: the restack journal did not survive: %v", name, err)
			}
			close(resume)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			p.restartOn(cut, "stopped at "+name)
			p.check("after restacking past " + name)
		})
	}
}

// stopAt makes the daemon stop at the named point (once): reached is
// closed when it gets there, and it goes on when resume is closed.
func stopAt(t *testing.T, name string) (reached, resume chan struct{}) {
	reached, resume = make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(n string) {
		if n == name {
			once.Do(func() { close(reached); <-resume })
		}
	}
	stepHook.Store(&hook)
	t.Cleanup(func() { stepHook.Store(nil) })
	return reached, resume
}
