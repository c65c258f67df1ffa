package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// vmSDKVersion is the SDK run against the agent inside a real VM (one
// version: the guest runs under software emulation in CI, so it is slow).
const vmSDKVersion = "2.51.0"

// bootGuest boots a QEMU microVM whose PID 1 is aenv-agent (init mode),
// reachable through a tap in a test namespace, and returns a forwarder from
// debugAddr on the host to the guest's agent.
func bootGuest(t *testing.T) (stop func()) {
	t.Helper()
	a := guestassets.Get(t)
	d, err := qemu.New(context.Background(), qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	_, tn := bootVM(t, d, a, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The scenario's work directory, writable by the guest's default user.
	if _, errb, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, "/bin/sh", "-c", "mkdir -p -m 0777 /tmp/e2e"); err != nil || code != 0 {
		t.Fatalf("prepare guest: %v %d %s", err, code, errb)
	}
	checkClockSync(ctx, t, tn)
	return forward(t, debugAddr, func(ctx context.Context) (net.Conn, error) {
		return tn.DialContext(ctx, "tcp", tn.AgentURL()[len("http://"):])
	})
}

// bootVM boots the guest image a on d (extra appended to the kernel
// command line) and waits for its agent to answer.
func bootVM(t *testing.T, d *qemu.Driver, a *image.Assets, extra string) (vmm.Machine, *vmmtest.TestNet) {
	t.Helper()
	tn := vmmtest.NewTestNet(t)
	vm, err := d.Boot(context.Background(), vmm.Config{
		ID: "agent-e2e", Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: strings.TrimSpace("root=/dev/vda ro quiet " + vmmtest.IPCmdline + " " + extra),
		VCPUs:   1, MemoryMiB: 512, RunDir: filepath.Join(t.TempDir(), "vm"),
		Drives: []vmm.Drive{{ID: "rootfs", Path: a.Rootfs, ReadOnly: true}},
		NICs:   []vmm.NIC{tn.NIC()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := tn.WaitHealthy(ctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("%v\nconsole:\n%s", err, console)
	}
	return vm, tn
}

// forward accepts on addr and splices each connection to one from dial.
func forward(t *testing.T, addr string, dial func(context.Context) (net.Conn, error)) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s (is port 49983 taken?): %v", addr, err)
	}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				g, err := dial(ctx)
				cancel()
				if err != nil {
					return
				}
				defer g.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(g, c); g.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				go func() { io.Copy(c, g); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return func() { ln.Close() }
}

// checkClockSync: in init mode, POST /init sets the guest clock from the
// host's timestamp (a restored snapshot wakes up with a stale clock).
func checkClockSync(ctx context.Context, t *testing.T, tn *vmmtest.TestNet) {
	t.Helper()
	initAt := func(ts time.Time) {
		body := strings.NewReader(`{"timestamp":"` + ts.UTC().Format(time.RFC3339Nano) + `"}`)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tn.AgentURL()+"/init", body)
		req.Header.Set("Content-Type", "application/json")
		resp, err := tn.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("/init: %s", resp.Status)
		}
	}
	future := time.Now().AddDate(3, 0, 0)
	initAt(future)
	out, _, _, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, "date", "-u", "+%Y")
	if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(future.UTC().Year()) {
		t.Fatalf("guest clock after /init with a timestamp in %d: %q %v", future.Year(), out, err)
	}
	initAt(time.Now())
}
