package proxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

// record is a sandbox as the test's registry holds it.
type record struct {
	Sandbox
	running bool
}

var errNotFound = errors.New("sandbox not found")

// sandboxes is a registry of sandboxes on real network slots (guests
// played by namespaces); what the orchestrator would hold.
type sandboxes struct {
	recs  map[string]record
	slots map[string]*network.Slot
	// connects counts Connect calls (auto-resumes), by sandbox.
	connects map[string]int
}

func (s *sandboxes) Get(id string) (Sandbox, error) {
	r, ok := s.recs[id]
	if !ok {
		return Sandbox{}, errNotFound
	}
	return r.Sandbox, nil
}

func (s *sandboxes) Slot(id string) (Guest, int, error) {
	sl, ok := s.slots[id]
	if !ok || !s.recs[id].running {
		return nil, 0, errNotFound
	}
	return sl, 1, nil
}

func (s *sandboxes) Connect(_ context.Context, id string, _ time.Duration, _ bool) error {
	if s.connects != nil {
		s.connects[id]++
	}
	return errNotFound
}

// guestSlots acquires n network slots whose guests are namespaces (root
// only: the test skips otherwise).
func guestSlots(t *testing.T, n int) []*network.Slot {
	t.Helper()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	cfg := w.Config()
	cfg.GuestNetNS = true
	m, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	slots := make([]*network.Slot, n)
	for i := range slots {
		if slots[i], err = m.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return slots
}

// guestServer serves HTTP in a slot's guest: it answers with the request
// headers it got, and counts requests.
func guestServer(t *testing.T, s *network.Slot, hits *atomic.Int32) {
	t.Helper()
	l := nettest.Listen(t, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, 8080))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		json.NewEncoder(w).Encode(r.Header)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

func TestProxyIsolation(t *testing.T) {
	slots := guestSlots(t, 2)
	hits := make([]atomic.Int32, 2)
	for i, s := range slots {
		guestServer(t, s, &hits[i])
	}
	reg := &sandboxes{
		recs: map[string]record{
			"run1": {running: true}, "run2": {running: true},
			"paused1": {Sandbox: Sandbox{Paused: true}},
			"locked":  {running: true, Sandbox: Sandbox{TrafficToken: "tok"}},
		},
		// The paused sandbox's slot was handed to run2: reaching it would
		// be reaching another sandbox.
		slots: map[string]*network.Slot{"run1": slots[0], "run2": slots[1], "paused1": slots[1], "locked": slots[0]},
	}
	const key = "e2b_0123456789abcdef"
	p := New(reg, "sbx.test", nil)
	p.APIKey = key
	srv := httptest.NewServer(p)
	defer srv.Close()
	var mu sync.Mutex
	do := func(t *testing.T, host string, hdr map[string]string) (*http.Response, http.Header) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got http.Header
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
		}
		return resp, got
	}

	t.Run("control-plane headers do not reach the guest", func(t *testing.T) {
		basicKey := "Basic " + base64.StdEncoding.EncodeToString([]byte(key+":"))
		for _, c := range []struct {
			name, auth string
			keep       bool
		}{{"bearer API key", "Bearer " + key, false}, {"API key as basic credentials", basicKey, false},
			{"the agent's user selection", "Basic " + base64.StdEncoding.EncodeToString([]byte("user:")), true},
			{"an app's own token", "Bearer app-token", true}} {
			resp, got := do(t, "8080-run1.sbx.test", map[string]string{
				"X-API-Key": key, "Authorization": c.auth, "Cookie": "theme=dark; session=" + key,
				"X-Access-Token": "agent-token", "Proxy-Authorization": "Basic eDp5",
				HeaderTrafficToken: "t",
			})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: status %d", c.name, resp.StatusCode)
			}
			for _, k := range []string{"X-Api-Key", "X-Access-Token", "Proxy-Authorization", HeaderTrafficToken} {
				if v := got.Get(k); v != "" {
					t.Errorf("%s: guest got %s: %q", c.name, k, v)
				}
			}
			if got.Get("Cookie") != "theme=dark" {
				t.Errorf("%s: guest got cookies %q, want only theme=dark", c.name, got.Get("Cookie"))
			}
			if kept := got.Get("Authorization") == c.auth; kept != c.keep {
				t.Errorf("%s: Authorization forwarded=%v, want %v", c.name, kept, c.keep)
			}
		}
	})

	t.Run("private traffic needs its token", func(t *testing.T) {
		if resp, _ := do(t, "8080-locked.sbx.test", nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("without the token: status %d, want 403", resp.StatusCode)
		}
		resp, got := do(t, "8080-locked.sbx.test", map[string]string{HeaderTrafficToken: "tok"})
		if resp.StatusCode != http.StatusOK || got.Get(HeaderTrafficToken) != "" {
			t.Errorf("with the token: status %d, token forwarded %q", resp.StatusCode, got.Get(HeaderTrafficToken))
		}
	})

	t.Run("unknown and paused sandboxes answer 502 and touch nobody", func(t *testing.T) {
		before := hits[1].Load()
		for _, c := range []struct {
			name string
			host string
			hdr  map[string]string
		}{
			{"paused by host", "8080-paused1.sbx.test", nil},
			{"unknown by host", "8080-gone.sbx.test", nil},
			{"paused by header", "127.0.0.1", map[string]string{HeaderSandboxID: "paused1", HeaderSandboxPort: "8080"}},
			{"unknown by header", "127.0.0.1", map[string]string{HeaderSandboxID: "gone", HeaderSandboxPort: "8080"}},
			{"an id that is an upstream address", "127.0.0.1", map[string]string{HeaderSandboxID: "run2.1.8080", HeaderSandboxPort: "8080"}},
			{"an id with a port", "127.0.0.1", map[string]string{HeaderSandboxID: "run2:8080", HeaderSandboxPort: "8080"}},
		} {
			resp, _ := do(t, c.host, c.hdr)
			if resp.StatusCode != http.StatusBadGateway {
				t.Errorf("%s: status %d, want 502", c.name, resp.StatusCode)
			}
		}
		if n := hits[1].Load() - before; n != 0 {
			t.Errorf("requests for other sandboxes reached run2's guest %d times", n)
		}
		if resp, _ := do(t, "8080-run2.sbx.test", nil); resp.StatusCode != http.StatusOK || hits[1].Load() != before+1 {
			t.Errorf("run2 itself is unreachable (status %d): the check above proves nothing", resp.StatusCode)
		}
	})
}
