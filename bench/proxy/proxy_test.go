package proxybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
	"github.com/agentenv/agentenv/proxy"
)

const (
	bigAnswer = 64 << 20 // bytes per large answer
	bigRounds = 5        // large answers per path and round
	smallReqs = 200      // small requests per path and round
	rounds    = 3
	guestPort = 8080
)

var errNotFound = errors.New("sandbox not found")

// sandboxes is the proxy's view of one running sandbox on slot.
type sandboxes struct{ slot *network.Slot }

func (s sandboxes) Get(id string) (proxy.Sandbox, error) {
	if id != "bench" {
		return proxy.Sandbox{}, errNotFound
	}
	return proxy.Sandbox{}, nil
}

func (s sandboxes) Slot(id string) (proxy.Guest, int, error) {
	if id != "bench" {
		return nil, 0, errNotFound
	}
	return s.slot, 1, nil
}

func (sandboxes) Connect(context.Context, string, time.Duration, bool) error {
	return errNotFound
}

// guest starts an HTTP server in the slot's guest: /big answers bigAnswer
// bytes, anything else a few bytes.
func guest(b *testing.B, s *network.Slot) {
	l := nettest.Listen(b, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, guestPort))
	chunk := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(bigAnswer))
		for range bigAnswer / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
}

// path is one way to the guest: a client and the request it sends.
type path struct {
	name   string
	client *http.Client
	req    func(p string) *http.Request
}

func BenchmarkProxy(b *testing.B) {
	nettest.RequireRoot(b)
	w := nettest.NewWorld(b, nettest.Prefix())
	cfg := w.Config()
	cfg.GuestNetNS = true
	m, err := network.New(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Shutdown(context.Background()) })
	slot, err := m.Acquire(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	guest(b, slot)
	srv := httptest.NewServer(proxy.New(sandboxes{slot}, "sbx.test", nil))
	b.Cleanup(srv.Close)

	direct := path{name: "direct", client: &http.Client{Transport: &http.Transport{
		DisableCompression: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return slot.DialGuest(ctx, "tcp", guestPort)
		}}}, req: func(p string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "http://guest"+p, nil)
		return r
	}}
	proxied := path{name: "proxy", client: &http.Client{Transport: &http.Transport{DisableCompression: true}},
		req: func(p string) *http.Request {
			r, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
			r.Host = fmt.Sprintf("%d-bench.sbx.test", guestPort)
			return r
		}}
	for range b.N {
		var thr [2][]float64
		var lat [2][]time.Duration
		for round := range rounds {
			paths := []path{direct, proxied}
			if round%2 == 1 { // neither path always runs on a warmer machine
				paths = []path{proxied, direct}
			}
			for _, p := range paths {
				i := slices.Index([]string{"direct", "proxy"}, p.name)
				thr[i] = append(thr[i], throughput(b, p))
				lat[i] = append(lat[i], latencies(b, p)...)
			}
		}
		td, tp := median(thr[0]), median(thr[1])
		ld, lp := medianDur(lat[0]), medianDur(lat[1])
		b.ReportMetric(td, "direct-MB/s")
		b.ReportMetric(tp, "proxy-MB/s")
		b.ReportMetric(tp/td, "throughput-x-direct")
		b.ReportMetric(float64(lp)/float64(ld), "small-p50-x-direct")
		b.Logf("large answers: proxy %.0f MB/s, direct %.0f MB/s (%.2fx); small answers p50: proxy %v, direct %v (%.2fx)",
			tp, td, tp/td, lp, ld, float64(lp)/float64(ld))
	}
}

// throughput downloads bigRounds large answers and returns MB/s.
func throughput(b *testing.B, p path) float64 {
	start := time.Now()
	for range bigRounds {
		resp, err := p.client.Do(p.req("/big"))
		if err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != bigAnswer {
			b.Fatalf("%s: read %d of %d bytes: %v", p.name, n, bigAnswer, err)
		}
	}
	return float64(bigRounds*bigAnswer) / 1e6 / time.Since(start).Seconds()
}

// latencies times smallReqs small requests.
func latencies(b *testing.B, p path) []time.Duration {
	out := make([]time.Duration, 0, smallReqs)
	for range smallReqs {
		start := time.Now()
		resp, err := p.client.Do(p.req("/small"))
		if err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "ok\n" {
			b.Fatalf("%s: small answer %q: %v", p.name, body, err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianDur(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
