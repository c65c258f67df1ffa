package vmmtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Guest network of every test VM: the same addresses in every namespace,
// as snapshot clones require.
const (
	GuestIP   = "169.254.0.21"
	HostIP    = "169.254.0.22"
	GuestMAC  = "02:ae:00:00:00:01"
	IPCmdline = "ip=" + GuestIP + "::" + HostIP + ":255.255.255.252::eth0:off"
	AgentPort = 49983
)

var netSeq atomic.Int64

// TestNet is a network namespace holding one tap device for one VM, and an
// HTTP client that dials from inside that namespace.
type TestNet struct {
	Name string
	ns   netns.NsHandle
	tap  *os.File
	HTTP *http.Client
}

// NewTestNet creates a namespace with a configured tap; t.Cleanup removes it.
func NewTestNet(t testing.TB) *TestNet {
	t.Helper()
	name := fmt.Sprintf("vmmt-%d-%d", os.Getpid(), netSeq.Add(1))
	tn := &TestNet{Name: name}
	err := inNewNS(name, func(ns netns.NsHandle) error {
		tn.ns = ns
		f, err := vmm.OpenTap("tap0")
		if err != nil {
			return err
		}
		tn.tap = f
		return configureTap("tap0")
	})
	t.Cleanup(func() {
		if tn.tap != nil {
			tn.tap.Close()
		}
		if tn.ns.IsOpen() {
			tn.ns.Close()
		}
		_ = netns.DeleteNamed(name)
	})
	if err != nil {
		t.Fatalf("test network %s: %v", name, err)
	}
	tn.HTTP = &http.Client{Transport: &http.Transport{DialContext: tn.DialContext, DisableKeepAlives: true}}
	return tn
}

// NIC is the VM side of the test network.
func (tn *TestNet) NIC() vmm.NIC { return vmm.NIC{ID: "eth0", MAC: GuestMAC, Tap: tn.tap} }

// AgentURL is the guest agent's base URL as seen from the namespace.
func (tn *TestNet) AgentURL() string { return fmt.Sprintf("http://%s:%d", GuestIP, AgentPort) }

// DialContext opens a TCP connection from inside the namespace: a socket
// belongs to the namespace of the thread that created it.
func (tn *TestNet) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	if err := netns.Set(tn.ns); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: Go discards it when the goroutine ends.
		return nil, fmt.Errorf("return to host namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// WaitHealthy polls the agent's /health until it answers 2xx.
func (tn *TestNet) WaitHealthy(ctx context.Context) error {
	var last error
	// Short first attempts: a SYN lost while the guest's NIC comes back would
	// otherwise wait for TCP's one-second retransmission. Longer later ones,
	// for a guest slowed down by a loaded host.
	start := time.Now()
	for {
		attempt := 500 * time.Millisecond
		if time.Since(start) > 20*time.Second {
			attempt = 3 * time.Second
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tn.AgentURL()+"/health", nil)
		hc := &http.Client{Transport: tn.HTTP.Transport, Timeout: attempt}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("health: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not healthy: %w (last: %v)", ctx.Err(), last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func inNewNS(name string, fn func(netns.NsHandle) error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	_ = netns.DeleteNamed(name)
	ns, err := netns.NewNamed(name) // also switches this thread into it
	if err != nil {
		_ = netns.Set(orig)
		runtime.UnlockOSThread()
		return fmt.Errorf("create netns: %w", err)
	}
	fnErr := fn(ns)
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: Go discards it when the goroutine ends.
		return fmt.Errorf("return to host namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return fnErr
}

func configureTap(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	addr, _ := netlink.ParseAddr(HostIP + "/30")
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("up %s: %w", name, err)
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	return nil
}
