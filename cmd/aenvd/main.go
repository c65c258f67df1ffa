// Command aenvd is the AgentENV node server: the E2B-compatible control API,
// the sandbox proxy and the orchestrator of this node's sandboxes.
//
//	aenvd [--config /etc/aenv/aenvd.toml]
//	aenvd --print-default-config
//	aenvd vm run [-- COMMAND]   (boot one sandbox VM without the server; vm.go)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"github.com/agentenv/agentenv/composeup"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/cgroup"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/inherited"
	"github.com/agentenv/agentenv/recovery"
	"github.com/agentenv/agentenv/replica"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/reponode"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/guest/variants"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmselect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "vm" {
		os.Exit(vmMain(os.Args[1:]))
	}
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
	memDevSet, err := config.IsSet(*cfgPath, "storage", "memory_devices")
	if err == nil {
		err = preflight(cfg, memDevSet, realHost)
	}
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
	vb, err := chooseBackend(ctx, cfg, assets, log)
	if err != nil {
		return err
	}
	// The repository first: its layer socket serves the lazy lowers of the
	// storage daemon's devices, which a daemon started now re-opens.
	rn, closeRepo, err := snapshotRepository(ctx, cfg, reg)
	if err != nil {
		return err
	}
	defer closeRepo()
	devices, backend, closeStorage, err := storageDaemon(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStorage()
	// Before the network manager clears the previous run's slots, take over
	// the VMs a crashed predecessor left running; their slots are kept and
	// the orchestrator re-adopts them as running sandboxes.
	recovered, err := recovery.Recover(ctx, vb.driver, st, devices, cfg.DataDir, log)
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
		DataDir: cfg.DataDir, Driver: vb.driver, Network: nets, Store: st, Storage: devices, StorageBackend: backend, MaxLayers: cfg.Sandbox.MaxLayers, Prefetch: cfg.Sandbox.Prefetch, FlattenPaused: cfg.Sandbox.FlattenPaused, MemoryDevices: cfg.Storage.MemoryDevices, VCPUs: cfg.Guest.VCPUs, Recovered: recovered,
		Groups: groups, VMMUIDBase: uint32(cfg.VMM.UIDBase), Remote: rn.remote(),
		StoragePoolLow: cfg.Storage.PoolLow, StoragePoolHigh: cfg.Storage.PoolHigh, VolumeSizeMiB: cfg.Storage.VolumeSizeMiB,
		VMMPool: orchestrator.PoolOptions{Low: cfg.VMMPool.Low, High: cfg.VMMPool.High, ReserveMiB: cfg.VMMPool.ReserveMiB,
			Templates: cfg.VMMPool.Templates},
		MemoryMiB: cfg.Guest.MemoryMiB, DefaultUser: cfg.Guest.DefaultUser, Registerer: reg, Logger: log,
		Admission: admissionController(cfg, vb.accel, log),
	})
	if err != nil {
		return err
	}
	rn.attach(orch, cfg.DataDir, vb.driver, log) // before builds: ready templates are committed as they load
	if _, err := orch.EnsureTemplate(ctx, assets); err != nil {
		return err
	}
	imgOpts := imageOptions(cfg, assets, log)
	if err := orch.EnableBuilds(ctx, imgOpts); err != nil {
		return err
	}
	defer orch.CloseBuilds()
	starter, err := composeStarter(cfg, imgOpts, log)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, node{orch: orch, store: st, repo: rn, key: key, registry: reg, backend: vb, compose: starter}, log)
}

// backend is the VMM backend, chosen once (chooseBackend): vmmselect logs
// the choice and /nodes reports it.
type backend struct {
	driver     vmm.Driver
	accel, why string
}

func chooseBackend(ctx context.Context, cfg config.Config, assets *image.Assets, log *slog.Logger) (backend, error) {
	choice, err := vmmselect.Select(ctx, vmmselect.Options{Prefer: cfg.VMM.Driver, Kernel: assets.Kernel, Accel: cfg.VMM.Accel, Log: log})
	if err != nil {
		return backend{}, err
	}
	b := backend{driver: choice.Driver, why: choice.Reason}
	if q, ok := b.driver.(*qemu.Driver); ok {
		b.accel, _ = q.Accel()
	}
	return b, nil
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
	// Atomic and fsynced: clients are given this key, so a power loss must
	// not leave an empty file that the next start replaces with a new key.
	if err := atomicfile.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
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

// composeStarter starts compose projects with images pulled through the
// node's registry configuration (the one template builds use), archives
// kept in the data directory until handed in.
func composeStarter(cfg config.Config, img template.ImageOptions, log *slog.Logger) (*composeup.Starter, error) {
	puller, err := oci.NewPuller(img.Pull)
	if err != nil {
		return nil, fmt.Errorf("compose image puller: %w", err)
	}
	dir := filepath.Join(cfg.DataDir, "compose-tmp")
	_ = os.RemoveAll(dir) // archives of projects a crash interrupted
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("compose archive dir: %w", err)
	}
	return &composeup.Starter{Puller: puller, TempDir: dir, Log: log.With("component", "compose")}, nil
}

// imageOptions configures template builds from the [image] section.
func imageOptions(cfg config.Config, assets *image.Assets, log *slog.Logger) template.ImageOptions {
	agent, _ := agentPath(cfg) // resolved already by guestAssets
	return template.ImageOptions{
		Pull: oci.Options{CacheDir: cfg.ImageCacheDir(), DefaultRegistry: cfg.Image.DefaultRegistry,
			AllowedRegistries: cfg.Image.AllowedRegistries, InsecureRegistries: cfg.Image.InsecureRegistries, Log: log},
		RootfsSizeMiB: cfg.Image.RootfsSizeMiB, Agent: agent, Assets: assets,
		ReadyTimeout: cfg.Image.ReadyTimeout.Duration, StepTimeout: cfg.Image.StepTimeout.Duration,
		Rootfs: func(ctx context.Context, variant string) (string, error) {
			v, err := variants.Lookup(variant)
			if err != nil {
				return "", err
			}
			return image.BuildVariant(ctx, image.Options{Agent: agent, CacheDir: cfg.Guest.AssetsCache, Log: log}, v)
		},
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

// storageDaemon returns the storage daemon serving the node's disks, its
// backend's name and its close: aenv-storaged, connected to (and started
// when nothing answers; it outlives aenvd so devices survive restarts), or
// for the "local" backend ("files", its former name) the same daemon run
// in process on <data_dir>/storage, whose devices the next aenvd serves
// again on the same sockets.
func storageDaemon(ctx context.Context, cfg config.Config, log *slog.Logger) (disk.Devices, string, func(), error) {
	if cfg.Storage.Backend == "local" || cfg.Storage.Backend == "files" {
		dir := filepath.Join(cfg.DataDir, "storage")
		if err := privateDataDir(dir); err != nil {
			return nil, "", nil, fmt.Errorf("storage dir: %w", err)
		}
		l, err := disk.StartLocal(ctx, dir, log)
		if err != nil {
			return nil, "", nil, err
		}
		return l.Devices(), "local", func() {
			if err := l.Close(); err != nil {
				log.Warn("stop the in-process storage daemon", "err", err)
			}
		}, nil
	}
	c, err := connectStoraged(ctx, cfg)
	if err != nil {
		return nil, "", nil, err
	}
	return c.Devices(), "storaged", func() { c.Close() }, nil
}

// connectStoraged connects to aenv-storaged, starting it when nothing
// answers.
func connectStoraged(ctx context.Context, cfg config.Config) (*disk.Storaged, error) {
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
	var args []string
	if w := cfg.Repository.LayerWait.Duration; w > 0 {
		args = append(args, "-layer-wait", w.String())
	}
	if cfg.Storage.SharedMemory != "" {
		args = append(args, "-shared-block", cfg.Storage.SharedMemory)
	}
	return disk.ConnectStoraged(sctx, socket, bin, filepath.Join(dir, "storaged.log"), filepath.Join(dir, "state"), filepath.Join(dir, "run"), args...)
}

// vmmGroups returns the control groups VMMs are confined in (nil when
// sandbox.cgroups is off): aenv/<network prefix> in each hierarchy, so
// nodes sharing a host keep to their own groups.
func vmmGroups(cfg config.Config, log *slog.Logger) (sandbox.Groups, error) {
	if !cfg.Sandbox.Cgroups {
		log.Warn("VMMs run without control groups of their own (sandbox.cgroups = false)")
		return nil, nil
	}
	h, err := detectGroups(cfg, realHost)
	if err == nil && cfg.Sandbox.CgroupDelegated {
		err = h.EnterLeaf(os.Getpid())
	}
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
	if len(h.Undelegated) > 0 {
		log.Warn("controllers not delegated to the node: VMMs run without their limits", "controllers", h.Undelegated)
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
	if err == nil && cfg.Repository.LazyRootfs {
		err = rn.ServeLayers(ctx, layerSocket(cfg))
	}
	if err != nil {
		_ = rn.Close()
		return nil, func() {}, err
	}
	registerLazyCosts(reg, rn)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_repository_layer_fetched_bytes_total",
		Help: "Bytes of layers fetched whole from peers and the store."},
		func() float64 { return float64(rn.FetchedWhole()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_repository_workingset_pack_fetched_bytes_total",
		Help: "Bytes of memory working-set packs read from the store (by the imports of stacks read lazily)."},
		func() float64 { return float64(rn.PacksFetched()) }))
	return &repoNode{n: rn}, func() { _ = rn.Close() }, nil
}

// registerLazyCosts exports what the layer socket's lazy reads cost, by
// the layers' use (label "use": rootfs or memory).
func registerLazyCosts(reg prometheus.Registerer, rn *reponode.Node) {
	counters := []struct {
		name, help string
		of         func(reponode.LazyCost) int64
	}{
		{"aenvd_repository_lazy_fetched_bytes_total",
			"Bytes of layers fetched from peers and the store for lazy reads (before the layers are fetched whole).",
			func(c reponode.LazyCost) int64 { return c.Fetched }},
		{"aenvd_repository_lazy_read_bytes_total",
			"Bytes of the distinct blocks of lazily read layers the storage daemon read (its VMs' memory faults and disk reads).",
			func(c reponode.LazyCost) int64 { return c.Read }},
		{"aenvd_repository_lazy_readahead_bytes_total",
			"Bytes fetched for lazy reads beyond what the storage daemon read, on sequential misses.",
			func(c reponode.LazyCost) int64 { return c.ReadAhead }},
		{"aenvd_repository_lazy_prefetched_bytes_total",
			"Bytes of layers' recorded working sets fetched ahead of the storage daemon's reads.",
			func(c reponode.LazyCost) int64 { return c.Prefetched }},
	}
	for _, c := range counters {
		for _, use := range []string{repo.UseRootfs, repo.UseMemory} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help,
				ConstLabels: prometheus.Labels{"use": use}},
				func() float64 { return float64(c.of(rn.LazyCosts()[use])) }))
		}
	}
}

// layerSocket is where the node serves lazy rootfs layers to its storage
// daemon: a fixed path, since the daemon's device records name it.
func layerSocket(cfg config.Config) string { return filepath.Join(cfg.DataDir, "layers.sock") }

// repoNode hands the repository to the orchestrator: its layer fetches
// (remote) and its replica joined to the verbs' hooks (attach); nil
// interfaces when the node has none (never a typed nil).
type repoNode struct {
	n   *reponode.Node
	rep *replica.Replica // once attached
}

// startUploads starts the uploader: at once outside a cluster, once the
// scheduler answered in one (a revived node's queue may hold pauses of
// stale copies, cancelled when they are removed).
func (r *repoNode) startUploads(ctx context.Context) {
	if r != nil {
		r.n.Uploads.Start(ctx)
	}
}

// setPeers takes the peers the cluster scheduler names.
func (r *repoNode) setPeers(endpoints []string) { r.n.Peers.SetDiscovered(endpoints) }

func (r *repoNode) remote() disk.Fetcher {
	if r == nil {
		return nil
	}
	return r.n
}
