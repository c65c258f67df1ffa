//go:build linux

package ublkbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/internal/kernellane/blockcheck"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/storage/ublk"
)

// BenchmarkDevices boots the kernel lane (qemu-system-x86_64) with fio and
// runs BenchmarkGuestDevices there; its table is in the log.
func BenchmarkDevices(b *testing.B) {
	if kernellane.InGuest() {
		b.Skip("the host side of BenchmarkGuestDevices")
	}
	if err := kernellane.Unavailable(); err != nil {
		b.Skip(err)
	}
	res, err := kernellane.Run(context.Background(), kernellane.Options{
		Run: "^$", Args: []string{"-test.bench=^BenchmarkGuestDevices$", "-test.benchtime=1x"},
		Modules: []string{"ublk_drv", "nbd", "loop"}, Fio: true, Timeout: 8 * time.Minute, MemoryMiB: 1536,
		Log: func(l string) { b.Log(l) },
	})
	if err != nil {
		b.Fatal(err)
	}
	if res.ExitCode != 0 {
		b.Fatalf("guest benchmark exited %d", res.ExitCode)
	}
	for _, l := range strings.Split(res.Output, "\n") {
		if strings.Contains(l, "ratio") || strings.HasPrefix(strings.TrimSpace(l), "|") {
			fmt.Println(l)
		}
	}
}

// BenchmarkGuestDevices runs in the lane: three devices over one image.
func BenchmarkGuestDevices(b *testing.B) {
	if !kernellane.InGuest() {
		b.Skip("runs inside the kernel lane (BenchmarkDevices)")
	}
	ctx := context.Background()
	dir := b.TempDir()
	fx := blockcheck.NewFixture(b, dir, 64<<20, 42)
	flat := filepath.Join(dir, "flat.raw")
	if err := os.WriteFile(flat, fx.Model, 0o600); err != nil {
		b.Fatal(err)
	}
	im := fx.Open(b, true)
	defer im.Close()
	srv := nbd.NewServer(nbd.Options{})
	if err := srv.Add(nbd.Export{Name: "img", Backend: im, ReadOnly: true}); err != nil {
		b.Fatal(err)
	}
	defer srv.Close()

	ublkReady, nbdReady := readyTimes(b, ctx, im, srv)
	ud, err := ublk.Create(ctx, im, ublk.Options{ReadOnly: true, Queues: 2, Depth: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer ud.Close()
	kd, err := nbd.AttachKernel(ctx, srv, "img", 2)
	if err != nil {
		b.Fatal(err)
	}
	defer kd.Detach()
	loop := attachLoop(b, flat)

	devs := []struct{ name, path string }{{"loop", loop}, {"nbd", kd.Path}, {"ublk", ud.Path}}
	jobs := []struct {
		name, rw, bs string
		qd           int
	}{
		{"4k randread QD1", "randread", "4k", 1},
		{"4k randread QD32", "randread", "4k", 32},
		{"1M seqread QD4", "read", "1M", 4},
	}
	b.Logf("| workload | loop | kernel nbd | ublk | ublk/nbd | ublk/loop |")
	for _, j := range jobs {
		var v [3]float64
		for i, d := range devs {
			v[i] = fio(b, d.path, j.rw, j.bs, j.qd)
		}
		unit := "IOPS"
		if j.bs == "1M" {
			unit = "MiB/s"
		}
		b.Logf("| %s (%s) | %.0f | %.0f | %.0f | %.2f | %.2f |", j.name, unit, v[0], v[1], v[2], v[2]/v[1], v[2]/v[0])
	}
	b.Logf("| create to ready (ms) | - | %.1f | %.1f | ratio ublk/nbd %.2f | |", ms(nbdReady), ms(ublkReady), float64(ublkReady)/float64(nbdReady))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// readyTimes returns the median time from nothing to a block device that
// answers a read, for ublk and for kernel NBD (five of each).
func readyTimes(b *testing.B, ctx context.Context, im ublk.Backend, srv *nbd.Server) (time.Duration, time.Duration) {
	var u, n []time.Duration
	for range 5 {
		start := time.Now()
		d, err := ublk.Create(ctx, im, ublk.Options{ReadOnly: true, Depth: 64})
		if err != nil {
			b.Fatal(err)
		}
		readOne(b, d.Path)
		u = append(u, time.Since(start))
		d.Close()
		start = time.Now()
		kd, err := nbd.AttachKernel(ctx, srv, "img", 2)
		if err != nil {
			b.Fatal(err)
		}
		readOne(b, kd.Path)
		n = append(n, time.Since(start))
		kd.Detach()
	}
	slices.Sort(u)
	slices.Sort(n)
	return u[2], n[2]
}

func readOne(b *testing.B, path string) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf, _ := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	defer unix.Munmap(buf)
	if _, err := f.ReadAt(buf, 0); err != nil {
		b.Fatalf("first read of %s: %v", path, err)
	}
}

// attachLoop binds a free loop device to file (read-only) and returns it.
func attachLoop(b *testing.B, file string) string {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		b.Fatal(err)
	}
	path := fmt.Sprintf("/dev/loop%d", n)
	dev, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(f.Fd())); err != nil {
		b.Fatalf("LOOP_SET_FD %s: %v", path, err)
	}
	f.Close()
	b.Cleanup(func() {
		unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
		dev.Close()
	})
	return path
}

// fio runs one job for a few seconds and returns IOPS (4k) or MiB/s (1M).
func fio(b *testing.B, dev, rw, bs string, qd int) float64 {
	out, err := exec.Command("fio", "--name=j", "--filename="+dev, "--readonly", "--direct=1", "--ioengine=io_uring",
		"--rw="+rw, "--bs="+bs, fmt.Sprintf("--iodepth=%d", qd), "--runtime=3", "--time_based", "--output-format=json").Output()
	if err != nil {
		b.Fatalf("fio on %s: %v: %s", dev, err, out)
	}
	var r struct {
		Jobs []struct {
			Read struct {
				IOPS    float64 `json:"iops"`
				BWBytes float64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) != 1 {
		b.Fatalf("fio output on %s: %v", dev, err)
	}
	if bs == "1M" {
		return r.Jobs[0].Read.BWBytes / (1 << 20)
	}
	return r.Jobs[0].Read.IOPS
}
