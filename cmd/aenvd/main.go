// Command aenvd is the AgentENV node server: the E2B-compatible control API,
// the sandbox proxy and the orchestrator of this node's sandboxes.
//
//	aenvd [--config /etc/aenv/aenvd.toml]
//	aenvd --print-default-config
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/cgroup"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/inherited"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot/repo/reponode"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/api/metricsring"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/proxy"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmselect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	cfgPath := flag.String("config", "", "TOML configuration file (defaults apply without one)")
	printDefault := flag.Bool("print-default-config", false, "print the default configuration and exit")
	printVersion := flag.Bool("version", false, "print the version, commit and build date and exit")
	flag.Parse()
	if *printVersion {
		fmt.Println("aenvd", version.Get())
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := inherited.CloseOnExec(); err != nil { // VMMs get only what they are handed
		log.Error("aenvd failed", "err", err)
		os.Exit(1)
	}
	slog.SetDefault(log)
	if *printDefault {
		text, err := config.Default().EncodeDocumented()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(text)
		return
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		log.Error("configuration", "err", err)
		os.Exit(2)
	}
	if err := failpoint.Check(); err != nil {
		log.Error("fault injection", "err", err)
		os.Exit(2)
	}
	if armed := failpoint.Armed(); len(armed) > 0 {
		log.Warn("fault injection armed (tests only)", "points", armed)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopControl, err := failpoint.ServeControl(ctx)
	if err != nil {
		log.Error("fault injection", "err", err)
		os.Exit(2)
	}
	defer stopControl()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("aenvd failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if err := privateDataDir(cfg.DataDir); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	key, err := apiKey(cfg)
	if err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "state.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	assets, err := guestAssets(ctx, cfg)
	if err != nil {
		return err
	}
	// One backend choice, made once: vmmselect logs it, /nodes reports it.
	choice, err := vmmselect.Select(ctx, vmmselect.Options{Prefer: cfg.VMM.Driver, Kernel: assets.Kernel, Accel: cfg.VMM.Accel, Log: log})
	if err != nil {
		return err
	}
	drv := choice.Driver
	accel, why := "", choice.Reason
	if q, ok := drv.(*qemu.Driver); ok {
		accel, _ = q.Accel()
	}
	// The repository first: its layer socket serves the lazy lowers of the
	// storage daemon's devices, which a daemon started now re-opens.
	rn, closeRepo, err := snapshotRepository(ctx, cfg, reg)
	if err != nil {
		return err
	}
	defer closeRepo()
	sd, err := storageDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	if sd != nil {
		defer sd.Close()
	}
	// Before the network manager clears the previous run's slots, take over
	// the VMs a crashed predecessor left running; their slots are kept and
	// the orchestrator re-adopts them as running sandboxes.
	// The disk backend, chosen once: the storage daemon's devices, or none
	// (files). A nil client must not become a non-nil interface.
	var devices client.Devices
	if sd != nil {
		devices = sd
	}
	recovered, err := orchestrator.Recover(ctx, drv, st, devices, cfg.DataDir, log)
	if err != nil {
		return err
	}
	netCfg, err := networkConfig(cfg, reg, log)
	if err != nil {
		return err
	}
	netCfg.Keep = recovered.Slots()
	nets, err := network.New(ctx, netCfg)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer nets.Shutdown(context.WithoutCancel(ctx))
	groups, err := vmmGroups(cfg, log)
	if err != nil {
		return err
	}
	orch, err := orchestrator.New(ctx, orchestrator.Options{
		DataDir: cfg.DataDir, Driver: drv, Network: nets, Store: st, Storage: devices, MaxLayers: cfg.Sandbox.MaxLayers, Prefetch: cfg.Sandbox.Prefetch, FlattenPaused: cfg.Sandbox.FlattenPaused, MemoryDevices: cfg.Storage.MemoryDevices, VCPUs: cfg.Guest.VCPUs, Recovered: recovered,
		Groups: groups, VMMUIDBase: uint32(cfg.VMM.UIDBase), Repository: rn.uploads(), Remote: rn.remote(),
		StoragePoolLow: cfg.Storage.PoolLow, StoragePoolHigh: cfg.Storage.PoolHigh, VolumeSizeMiB: cfg.Storage.VolumeSizeMiB,
		VMMPool: orchestrator.PoolOptions{Low: cfg.VMMPool.Low, High: cfg.VMMPool.High, ReserveMiB: cfg.VMMPool.ReserveMiB,
			Templates: cfg.VMMPool.Templates},
		MemoryMiB: cfg.Guest.MemoryMiB, DefaultUser: cfg.Guest.DefaultUser, Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	if _, err := orch.EnsureTemplate(ctx, assets); err != nil {
		return err
	}
	if err := orch.EnableBuilds(ctx, imageOptions(cfg, assets, log)); err != nil {
		return err
	}
	defer orch.CloseBuilds()
	px := proxy.New(orch, cfg.API.Domain, log)
	px.APIKey = key // stripped from anything forwarded to a guest
	// A sandbox's end (kill, pause) closes its streams through the proxy.
	defer orch.Subscribe(px.OnEvent)()
	// The sandbox metrics history, answered by range.
	history := metricsring.New(orch, 0, 0, log)
	history.Start(ctx)
	defer history.Close()
	hooks, err := webhooks.New(st, webhooks.Options{Logger: log}) // lifecycle webhooks, their pending deliveries resumed
	if err != nil {
		return err
	}
	hooks.Start(ctx)
	defer hooks.Close()
	defer orch.Subscribe(hooks.OnEvent)()
	hostname, _ := os.Hostname()
	if cfg.Cluster.NodeName != "" {
		hostname = cfg.Cluster.NodeName // one name in /nodes and in the cluster
	}
	handler := api.NewHandler(api.Options{
		Orchestrator: orch, APIKey: key, Domain: cfg.API.Domain, Proxy: px, Logger: log, Store: st, StateDir: cfg.DataDir,
		Node: api.NodeInfo{ID: hostname, Version: version.Version(), Commit: version.Get().Commit, Date: version.Get().Date,
			VMMDriver: drv.Name(), VMMAccel: accel, VMMReasons: why},
		DefaultTimeout: cfg.Sandbox.DefaultTimeout.Duration, MaxTimeout: cfg.Sandbox.MaxTimeout.Duration,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), MetricsHistory: history, Webhooks: hooks,
	})
	member, err := newClusterMember(cfg, orch, rn, drv.Name(), hostname, log)
	if err != nil {
		return err
	}
	// Until the scheduler first answered, requests wait (but health and
	// metrics): it names the copies this node must not serve.
	handler, gatedProxy := member.gate(handler, "/health", "/metrics"), member.gate(px)
	limits := defaultServerLimits(cfg)
	servers := []*http.Server{newHTTPServer(cfg.API.Listen, handler, limits)}
	if cfg.API.ProxyListen != "" {
		servers = append(servers, newHTTPServer(cfg.API.ProxyListen, gatedProxy, limits))
	}
	if cfg.API.ProxyTLSListen != "" {
		tlsCfg, err := proxy.TLSConfig(cfg.API.Domain, cfg.API.TLSCert, cfg.API.TLSKey, filepath.Join(cfg.DataDir, "tls"))
		if err != nil {
			return err
		}
		srv := newHTTPServer(cfg.API.ProxyTLSListen, gatedProxy, limits)
		srv.TLSConfig = tlsCfg
		servers = append(servers, srv)
	}
	errc := make(chan error, len(servers))
	for _, srv := range servers {
		ln, err := listenHTTP(srv.Addr, limits)
		if err != nil {
			return err
		}
		log.Info("listening", "addr", ln.Addr().String(), "tls", srv.TLSConfig != nil)
		go func() {
			if srv.TLSConfig != nil {
				errc <- srv.ServeTLS(ln, "", "")
				return
			}
			errc <- srv.Serve(ln)
		}()
	}
	member.start(ctx, func() { rn.startUploads(ctx) })
	log.Info("aenvd ready", "api", cfg.API.Listen, "proxy", cfg.API.ProxyListen, "dataDir", cfg.DataDir)
	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("http server", "err", err)
	}
	member.leave() // the scheduler stops placing here before the sandboxes pause
	log.Info("shutting down", "pauseRunning", cfg.Sandbox.PauseOnShutdown)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(sctx)
	}
	return orch.Shutdown(sctx, cfg.Sandbox.PauseOnShutdown)
}

// serverLimits are the HTTP servers' protections against slow and greedy
// clients (see newHTTPServer).
type serverLimits struct {
	readHeader, idle time.Duration
	perClient        int
}

func defaultServerLimits(cfg config.Config) serverLimits {
	return serverLimits{readHeader: 10 * time.Second, idle: 2 * time.Minute, perClient: cfg.Network.ConnsPerClient}
}

// maxHeaderBytes bounds a request's header block; SDK requests carry a few
// hundred bytes.
const maxHeaderBytes = 64 << 10

// newHTTPServer builds the API's or the proxy's server. A client must send
// its request headers within readHeader and may keep an idle connection for
// idle. There is deliberately no ReadTimeout or WriteTimeout: they bound
// the whole request or response, and the proxy carries E2B command and PTY
// streams and file transfers that rightly last minutes or hours (the
// agent's own keepalives keep them busy). What a client that sends a body
// or reads a response slowly can tie up is bounded by listenHTTP's limit on
// connections per client address instead.
func newHTTPServer(addr string, h http.Handler, l serverLimits) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: l.readHeader, IdleTimeout: l.idle,
		MaxHeaderBytes: maxHeaderBytes}
}

// listenHTTP opens a server's listener, limited to l.perClient concurrent
// connections per client address.
func listenHTTP(addr string, l serverLimits) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return proxy.LimitPerClient(ln, l.perClient), nil
}

// apiKey returns the configured key, or the one in the key file, creating
// it (e2b_<40 hex>, mode 0600) on first start.
func apiKey(cfg config.Config) (string, error) {
	if cfg.API.Key != "" {
		return cfg.API.Key, nil
	}
	path := cfg.KeyFilePath()
	if err := tighten(path, 0o600); err != nil {
		return "", fmt.Errorf("api key file: %w", err)
	}
	b, err := os.ReadFile(path)
	if err == nil {
		if k := strings.TrimSpace(string(b)); k != "" {
			return k, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("api key file: %w", err)
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("api key: %w", err)
	}
	k := "e2b_" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("api key file: %w", err)
	}
	slog.Info("generated an API key", "file", path)
	return k, nil
}

// privateDataDir makes the data dir 0700, or tightens an existing one: it
// holds the API key, sandbox records with agent tokens, logs and disks,
// none of which other local users may read.
func privateDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return tighten(dir, 0o700)
}

// privateStorageDir does the same for the storage daemon's directory and
// keeps its log (appended to across starts) unreadable by other users.
func privateStorageDir(dir, log string) error {
	if err := privateDataDir(dir); err != nil {
		return err
	}
	return tighten(log, 0o600)
}

// tighten clears the permission bits of path outside perm (a missing path
// is fine); files made by older versions may be wider.
func tighten(path string, perm os.FileMode) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&^perm == 0 {
		return nil
	}
	return os.Chmod(path, fi.Mode().Perm()&perm)
}

// agentPath is the configured aenv-agent binary, or the one next to aenvd.
func agentPath(cfg config.Config) (string, error) {
	if cfg.Guest.Agent != "" {
		return cfg.Guest.Agent, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locate aenv-agent: %w", err)
	}
	return filepath.Join(filepath.Dir(exe), "aenv-agent"), nil
}

// imageOptions configures template builds from the [image] section.
func imageOptions(cfg config.Config, assets *image.Assets, log *slog.Logger) template.ImageOptions {
	agent, _ := agentPath(cfg) // resolved already by guestAssets
	return template.ImageOptions{
		Pull: oci.Options{CacheDir: cfg.ImageCacheDir(), DefaultRegistry: cfg.Image.DefaultRegistry,
			AllowedRegistries: cfg.Image.AllowedRegistries, InsecureRegistries: cfg.Image.InsecureRegistries, Log: log},
		RootfsSizeMiB: cfg.Image.RootfsSizeMiB, Agent: agent, Assets: assets,
		ReadyTimeout: cfg.Image.ReadyTimeout.Duration, StepTimeout: cfg.Image.StepTimeout.Duration,
	}
}

func guestAssets(ctx context.Context, cfg config.Config) (*image.Assets, error) {
	agent, err := agentPath(cfg)
	if err != nil {
		return nil, err
	}
	a, err := image.Build(ctx, image.Options{Agent: agent, CacheDir: cfg.Guest.AssetsCache})
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	return a, nil
}

func networkConfig(cfg config.Config, reg prometheus.Registerer, log *slog.Logger) (network.Config, error) {
	nc := network.Config{Prefix: cfg.Network.Prefix, PoolLow: cfg.Network.PoolLow, PoolHigh: cfg.Network.PoolHigh,
		SocketMark: uint32(cfg.Network.SocketMark), Registerer: reg, Logger: log}
	for _, p := range []struct {
		s   string
		dst *netip.Prefix
	}{{cfg.Network.HostCIDR, &nc.HostCIDR}, {cfg.Network.VethCIDR, &nc.VethCIDR}} {
		if p.s == "" {
			continue
		}
		v, err := netip.ParsePrefix(p.s)
		if err != nil {
			return nc, fmt.Errorf("config network: %w", err)
		}
		*p.dst = v
	}
	for _, s := range cfg.Network.AlwaysDenied {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nc, fmt.Errorf("config network.always_denied: %w", err)
		}
		nc.AlwaysDenied = append(nc.AlwaysDenied, p)
	}
	if s := cfg.Network.DNSUpstream; s != "" {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nc, fmt.Errorf("config network.dns_upstream %q: want an IPv4 address with an optional :port", s)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		if !ap.Addr().Is4() {
			return nc, fmt.Errorf("config network.dns_upstream %q: want an IPv4 address", s)
		}
		nc.DNSUpstream = ap
	}
	return nc, nil
}

// storageDaemon connects to aenv-storaged (starting it when nothing answers;
// it outlives aenvd so devices survive restarts), or returns nil for the
// "files" backend.
func storageDaemon(ctx context.Context, cfg config.Config) (*client.Client, error) {
	if cfg.Storage.Backend != "storaged" {
		return nil, nil
	}
	dir := filepath.Join(cfg.DataDir, "storaged")
	socket, bin := cfg.Storage.Socket, cfg.Storage.Binary
	if socket == "" {
		socket = filepath.Join(dir, "storaged.sock")
	}
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("locate aenv-storaged: %w", err)
		}
		bin = filepath.Join(filepath.Dir(exe), "aenv-storaged")
	}
	if err := privateStorageDir(dir, filepath.Join(dir, "storaged.log")); err != nil {
		return nil, fmt.Errorf("storage daemon dir: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := client.Ensure(sctx, client.StartOptions{
		Socket: socket, Binary: bin, LogFile: filepath.Join(dir, "storaged.log"),
		Args: []string{"-state-dir", filepath.Join(dir, "state"), "-run-dir", filepath.Join(dir, "run")},
	})
	if err != nil {
		return nil, fmt.Errorf("storage daemon: %w", err)
	}
	return c, nil
}

// vmmGroups returns the control groups VMMs are confined in (nil when
// sandbox.cgroups is off): aenv/<network prefix> in each hierarchy, so
// nodes sharing a host keep to their own groups.
func vmmGroups(cfg config.Config, log *slog.Logger) (sandbox.Groups, error) {
	if !cfg.Sandbox.Cgroups {
		log.Warn("VMMs run without control groups of their own (sandbox.cgroups = false)")
		return nil, nil
	}
	h, err := cgroup.Detect(filepath.Join("aenv", cfg.Network.Prefix))
	if err == nil {
		// Probe once here, so a node that cannot manage groups fails at its
		// start and not at every create.
		var g *cgroup.Group
		if g, err = h.Create(fmt.Sprintf("probe-%d", os.Getpid()), cgroup.Limits{Pids: 1}); err == nil {
			err = g.Remove()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w (set sandbox.cgroups = false to run VMMs unconfined)", err)
	}
	log.Info("VMMs confined in control groups", "dirs", h.Dirs, "v2", h.V2)
	return h, nil
}

// snapshotRepository opens the [repository] the node commits pauses and
// snapshots to and reads other nodes' from (nil when the backend is
// "none") and starts its peer endpoint and, for lazy rootfs restores on
// the storage daemon, its layer socket (the uploader starts later); the
// returned func stops them.
func snapshotRepository(ctx context.Context, cfg config.Config, reg prometheus.Registerer) (*repoNode, func(), error) {
	rn, err := reponode.Open(ctx, cfg)
	if err != nil || rn == nil {
		return nil, func() {}, err
	}
	err = rn.Serve(ctx)
	if err == nil && cfg.Repository.LazyRootfs && cfg.Storage.Backend == "storaged" {
		err = rn.ServeLayers(ctx, layerSocket(cfg))
	}
	if err != nil {
		_ = rn.Close()
		return nil, func() {}, err
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_repository_lazy_fetched_bytes_total",
			Help: "Bytes of rootfs layers fetched from peers and the store for lazy reads (before the layers are fetched whole)."},
			func() float64 { return float64(rn.LazyFetched()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_repository_layer_fetched_bytes_total",
			Help: "Bytes of layers fetched whole from peers and the store."},
			func() float64 { return float64(rn.FetchedWhole()) }))
	return &repoNode{rn}, func() { _ = rn.Close() }, nil
}

// layerSocket is where the node serves lazy rootfs layers to its storage
// daemon: a fixed path, since the daemon's device records name it.
func layerSocket(cfg config.Config) string { return filepath.Join(cfg.DataDir, "layers.sock") }

// repoNode hands the repository to the orchestrator as its two small
// interfaces, nil ones when the node has none (never a typed nil).
type repoNode struct{ n *reponode.Node }

// startUploads starts the uploader: at once outside a cluster, once the
// scheduler answered in one (a revived node's queue may hold pauses of
// stale copies, cancelled when they are removed).
func (r *repoNode) startUploads(ctx context.Context) {
	if r != nil {
		r.n.Uploads.Start(ctx)
	}
}

func (r *repoNode) uploads() orchestrator.Uploads {
	if r == nil {
		return nil
	}
	return r.n
}

// setPeers takes the peers the cluster scheduler names.
func (r *repoNode) setPeers(endpoints []string) { r.n.Peers.SetDiscovered(endpoints) }

func (r *repoNode) remote() orchestrator.Remote {
	if r == nil {
		return nil
	}
	return r.n
}
