package clusterbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/gateway"
	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
)

const (
	bigBody   = 1 << 20 // bytes per throughput request
	requests  = 800     // per ratio, over its rounds
	rounds    = 5       // measurements per ratio
	parallel  = 8
	placeRuns = 3000
)

// stack is a scheduler on a real Redis, served over loopback gRPC.
type stack struct {
	sched pb.SchedulerClient
	rdb   *redis.Client
	addr  string // the scheduler's gRPC address
}

func newStack(b *testing.B) *stack {
	rs := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: 32})
	b.Cleanup(func() { _ = rdb.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := scheduler.New(scheduler.Options{Redis: rdb, Logger: quiet, HeartbeatInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterSchedulerServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(srv.Stop)
	conn, err := pb.Dial([]string{ln.Addr().String()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return &stack{sched: conn.Client(), rdb: rdb, addr: ln.Addr().String()}
}

// run sends n GETs of url with the header set, parallel at a time, and
// returns the elapsed time and each request's latency.
func run(b *testing.B, url string, hdr map[string]string, n int) (time.Duration, []time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: parallel}}
	defer client.CloseIdleConnections()
	lat := make([]time.Duration, n)
	var next sync.Mutex
	i := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= n {
					return
				}
				t0 := time.Now()
				req, _ := http.NewRequest("GET", url, nil)
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[k] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	return time.Since(start), lat
}

func p50(l []time.Duration) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkGatewayProxy: sandbox traffic through the gateway (lookup of
// the sandbox's node, reverse proxy) vs straight to the origin the node
// would forward to, in one run. The origin is a plain HTTP server (the
// measured hop is the gateway's; aenvd's own proxy is bench/aenvd's),
// answering /big chunked (a stream) and /sized with its Content-Length (a
// file download). The ratios are medians over rounds, each round timing
// every path back to back, in an order turning from round to round: the
// machine is shared, and its speed drifts between minutes more than the
// gateway costs. Beside the direct connection, the reference, a TCP relay
// in the gateway's place (relay_test.go) shows what a second connection
// costs by itself; the CPU per MiB of each path (client and origin
// included, all in this process) shows where the time goes.
func BenchmarkGatewayProxy(b *testing.B) {
	st := newStack(b)
	big := make([]byte, bigBody)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = w.Write(big)
		case "/sized":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			_, _ = w.Write(big)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	defer origin.Close()
	ctx := context.Background()
	status := &pb.NodeStatus{Name: "n1", ApiUrl: origin.URL, Capacity: &pb.Resources{CpuCount: 8, MemoryMb: 8192},
		Free: &pb.Resources{CpuCount: 8, MemoryMb: 8192}}
	if _, err := st.sched.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: status}); err != nil {
		b.Fatal(err)
	}
	if _, err := st.sched.Bind(ctx, &pb.BindRequest{SandboxId: "sbx1", Node: "n1"}); err != nil {
		b.Fatal(err)
	}
	relayURL := startRelay(b, origin.Listener.Addr().String())
	hdr := map[string]string{"E2b-Sandbox-Id": "sbx1", "E2b-Sandbox-Port": "49983"}
	for _, ttl := range []time.Duration{2 * time.Second, time.Nanosecond} {
		gw := httptest.NewServer(gateway.New(gateway.Options{Scheduler: st.sched, LookupTTL: ttl,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
		paths := []hop{{name: "direct", url: origin.URL}, {name: "relay", url: relayURL}, {name: "gateway", url: gw.URL, hdr: hdr}}
		for range b.N {
			for _, h := range paths { // warm every path
				run(b, h.url+"/big", h.hdr, 20)
			}
			for _, path := range []string{"/big", "/sized"} {
				m := measure(b, paths, path)
				fmt.Printf("gateway proxy (lookup cache %s, %s): throughput %.2fx direct (a TCP relay in its place: %.2fx); "+
					"p50 latency of small answers %.2fx direct; MB/s and ms of CPU per MiB: direct %.0f %.2f, relay %.0f %.2f, gateway %.0f %.2f (medians of %d rounds)\n",
					ttl, path, m.ratio["gateway"], m.ratio["relay"], m.latency, m.mbps["direct"], m.cpu["direct"],
					m.mbps["relay"], m.cpu["relay"], m.mbps["gateway"], m.cpu["gateway"], rounds)
				if path == "/sized" {
					b.ReportMetric(m.ratio["gateway"], "throughput-ratio-cache-"+ttl.String())
				}
			}
		}
		gw.Close()
	}
}

// hop is one way to the origin.
type hop struct {
	name, url string
	hdr       map[string]string
}

// figures are one path's medians over rounds, by hop name.
type figures struct {
	ratio, mbps, cpu map[string]float64 // throughput / direct's; MB/s; ms of CPU per MiB
	latency          float64            // the gateway's p50 of small answers / direct's
}

// measure times requests/rounds GETs of path on every hop per round, and
// as many small GETs through the gateway and directly.
func measure(b *testing.B, hops []hop, path string) figures {
	n := requests / rounds
	per := map[string][]float64{}
	var lat []float64
	for r := range rounds {
		took := map[string]time.Duration{}
		for i := range hops {
			h := hops[(r+i)%len(hops)]
			cpu0 := cpuTime()
			d, _ := run(b, h.url+path, h.hdr, n)
			cpu := cpuTime() - cpu0
			took[h.name] = d
			mib := float64(n*bigBody) / (1 << 20)
			per["mbps "+h.name] = append(per["mbps "+h.name], float64(n*bigBody)/d.Seconds()/1e6)
			per["cpu "+h.name] = append(per["cpu "+h.name], float64(cpu.Milliseconds())/mib)
		}
		for _, h := range hops {
			per["ratio "+h.name] = append(per["ratio "+h.name], took["direct"].Seconds()/took[h.name].Seconds())
		}
		_, lDirect := run(b, hops[0].url+"/small", nil, n)
		_, lGW := run(b, hops[len(hops)-1].url+"/small", hops[len(hops)-1].hdr, n)
		lat = append(lat, float64(p50(lGW))/float64(p50(lDirect)))
	}
	f := figures{ratio: map[string]float64{}, mbps: map[string]float64{}, cpu: map[string]float64{}, latency: median(lat)}
	for _, h := range hops {
		f.ratio[h.name] = median(per["ratio "+h.name])
		f.mbps[h.name] = median(per["mbps "+h.name])
		f.cpu[h.name] = median(per["cpu "+h.name])
	}
	return f
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkPlacement: placements per second as the gateway makes them
// (Place then Bind over gRPC, least-loaded over 10 nodes) vs Redis PINGs
// per second from the same client count, in one run.
func BenchmarkPlacement(b *testing.B) {
	st := newStack(b)
	ctx := context.Background()
	for i := range 10 {
		name := fmt.Sprintf("n%d", i)
		status := &pb.NodeStatus{Name: name, ApiUrl: "http://" + name + ".invalid", Capacity: &pb.Resources{CpuCount: 1 << 20, MemoryMb: 1 << 40},
			Free: &pb.Resources{CpuCount: 1 << 20, MemoryMb: 1 << 40}} // never full: reservations add up
		if _, err := st.sched.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: status}); err != nil {
			b.Fatal(err)
		}
	}
	timed := func(f func() error) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range placeRuns / parallel {
					if err := f(); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return float64(placeRuns) / time.Since(start).Seconds()
	}
	for range b.N {
		ping := timed(func() error { return st.rdb.Ping(ctx).Err() })
		var seq atomic.Int64
		place := timed(func() error {
			res := &pb.Resources{CpuCount: 1, MemoryMb: 256}
			p, err := st.sched.Place(ctx, &pb.PlaceRequest{Resources: res})
			if err != nil {
				return err
			}
			_, err = st.sched.Bind(ctx, &pb.BindRequest{SandboxId: fmt.Sprintf("s%d", seq.Add(1)), Node: p.Node.Status.Name, Resources: res})
			return err
		})
		fmt.Printf("placement: %.0f placements (Place+Bind)/s vs %.0f Redis PINGs/s = %.3fx (%d clients, 10 nodes)\n", place, ping, place/ping, parallel)
		b.ReportMetric(place, "placements/s")
	}
}
