// Package config is the configuration of the node server aenvd: one TOML
// file with documented defaults, each field overridable by an environment
// variable (AENVD_<SECTION>_<KEY>, listed in the `env` struct tags).
package config

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is the whole of aenvd's configuration.
type Config struct {
	// DataDir holds the state store, templates and per-sandbox files.
	DataDir string  `toml:"data_dir" env:"AENVD_DATA_DIR"`
	API     API     `toml:"api"`
	Network Network `toml:"network"`
	VMM     VMM     `toml:"vmm"`
	VMMPool VMMPool `toml:"vmm_pool"`
	Guest   Guest   `toml:"guest"`
	Sandbox Sandbox `toml:"sandbox"`
	Storage Storage `toml:"storage"`
	Image   Image   `toml:"image"`
	// Repository is where snapshots and templates are committed so that
	// other nodes can resume and create from them.
	Repository Repository `toml:"repository"`
	// Cluster joins the node to a cluster (docs/cluster.md).
	Cluster Cluster `toml:"cluster"`
	// Admission bounds what the node takes on (package admission).
	Admission Admission `toml:"admission"`
}

// Repository configures the snapshot repository (docs/repository.md): a
// directory, or a bucket of any S3-compatible store shared by the nodes.
type Repository struct {
	// Backend is "none" (the default: pauses and snapshots stay on this
	// node), "posix" (a directory, for nodes sharing a file system) or "s3"
	// (a bucket). With a repository, every pause and snapshot is also
	// committed to it in the background.
	Backend string `toml:"backend" env:"AENVD_REPOSITORY_BACKEND"`
	// Dir is the posix repository's directory; default <data_dir>/repository.
	Dir string `toml:"dir" env:"AENVD_REPOSITORY_DIR"`
	// Endpoint is the S3 store's URL (http(s)://host[:port]).
	Endpoint string `toml:"endpoint" env:"AENVD_REPOSITORY_ENDPOINT"`
	// Bucket holds the repository; Prefix is prepended to its keys.
	Bucket string `toml:"bucket" env:"AENVD_REPOSITORY_BUCKET"`
	Prefix string `toml:"prefix" env:"AENVD_REPOSITORY_PREFIX"`
	// Region is the bucket's region (empty: the store's default).
	Region string `toml:"region" env:"AENVD_REPOSITORY_REGION"`
	// AccessKey and SecretKey authenticate to the store; when both are
	// empty, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY do.
	AccessKey string `toml:"access_key" env:"AENVD_REPOSITORY_ACCESS_KEY"`
	SecretKey string `toml:"secret_key" env:"AENVD_REPOSITORY_SECRET_KEY"`
	// PathStyle puts the bucket in the URL path (most self-hosted stores)
	// rather than in the host name.
	PathStyle bool `toml:"path_style" env:"AENVD_REPOSITORY_PATH_STYLE"`
	// UploadConcurrency is the number of snapshots uploaded at once in the
	// background.
	UploadConcurrency int `toml:"upload_concurrency" env:"AENVD_REPOSITORY_UPLOAD_CONCURRENCY"`
	// ChunkSizeKiB is the chunk size of the layers' digest tables (a power
	// of two, 4..16384): the unit of lazy fetches and of verification.
	ChunkSizeKiB int `toml:"chunk_size_kib" env:"AENVD_REPOSITORY_CHUNK_SIZE_KIB"`
	// CacheMiB bounds the block cache of the remote layers this node reads
	// (shared by all of them; the least recently used block goes first).
	CacheMiB int `toml:"cache_mib" env:"AENVD_REPOSITORY_CACHE_MIB"`
	// LazyRootfs starts a VM brought from the repository before its
	// rootfs layers are here: the storage daemon reads them through the
	// node's layer socket (<data_dir>/layers.sock, verified chunks from
	// peers and the store) while they are fetched in the background.
	// false fetches every layer whole before the VM starts.
	LazyRootfs bool `toml:"lazy_rootfs" env:"AENVD_REPOSITORY_LAZY_ROOTFS"`
	// LayerWait bounds how long the storage daemon's lazy reads wait for
	// the layer socket while aenvd is away (restarting) before they fail
	// as I/O errors in the guest; passed to the daemon aenvd starts
	// (aenv-storaged -layer-wait). 0: the daemon's default, 5 minutes.
	LayerWait Duration `toml:"layer_wait" env:"AENVD_REPOSITORY_LAYER_WAIT"`
	// GCGrace keeps unreferenced blobs this long (uploads whose manifest
	// is not committed yet).
	GCGrace Duration `toml:"gc_grace" env:"AENVD_REPOSITORY_GC_GRACE"`
	// GCInterval is how often this node collects the repository's garbage
	// (0: never; the first run is one interval after the start).
	GCInterval Duration `toml:"gc_interval" env:"AENVD_REPOSITORY_GC_INTERVAL"`
	// LeaseTTL bounds a commit in progress: GC honours its lease this long.
	LeaseTTL Duration `toml:"lease_ttl" env:"AENVD_REPOSITORY_LEASE_TTL"`
	// PeerListen is the address this node serves its layers to peers on
	// ("" disables serving).
	PeerListen string `toml:"peer_listen" env:"AENVD_REPOSITORY_PEER_LISTEN"`
	// Peers are the other nodes' peer endpoints (http://host:port), asked
	// for a layer before the store. Environment: comma-separated.
	Peers []string `toml:"peers" env:"AENVD_REPOSITORY_PEERS"`
	// PeerToken, when set, is required from and sent to peers as a bearer
	// token.
	PeerToken string `toml:"peer_token" env:"AENVD_REPOSITORY_PEER_TOKEN"`
}

// RepositoryDir is Repository.Dir or its default.
func (c *Config) RepositoryDir() string {
	if c.Repository.Dir != "" {
		return c.Repository.Dir
	}
	return c.DataDir + "/repository"
}

func (r *Repository) validate() error {
	cs := r.ChunkSizeKiB
	switch {
	case r.Backend != "posix" && r.Backend != "s3" && r.Backend != "none":
		return fmt.Errorf("config: repository.backend %q: want posix, s3 or none", r.Backend)
	case r.Backend == "s3" && (r.Endpoint == "" || r.Bucket == ""):
		return fmt.Errorf("config: repository: the s3 backend needs an endpoint and a bucket")
	case (r.AccessKey == "") != (r.SecretKey == ""):
		return fmt.Errorf("config: repository: access_key and secret_key go together")
	case cs < 4 || cs > 16384 || cs&(cs-1) != 0:
		return fmt.Errorf("config: repository.chunk_size_kib %d is not a power of two within 4..16384", cs)
	case r.UploadConcurrency < 1 || r.CacheMiB < 1:
		return fmt.Errorf("config: repository: upload_concurrency and cache_mib must be at least 1")
	case r.GCGrace.Duration < 0 || r.LeaseTTL.Duration < time.Second:
		return fmt.Errorf("config: repository: gc_grace must not be negative and lease_ttl at least 1s")
	case r.GCInterval.Duration < 0:
		return fmt.Errorf("config: repository: gc_interval must not be negative")
	}
	return nil
}

// Cluster joins this node to a cluster run by aenv-scheduler (see
// docs/cluster.md). With no scheduler listed the node runs alone and the
// other settings do nothing.
type Cluster struct {
	// Scheduler lists aenv-scheduler gRPC addresses (host:port, one or
	// more); the node registers with one and moves to the next when it
	// fails. Environment: comma-separated.
	Scheduler []string `toml:"scheduler" env:"AENVD_CLUSTER_SCHEDULER"`
	// NodeName identifies the node in the cluster; empty: the host name.
	NodeName string `toml:"node_name" env:"AENVD_CLUSTER_NODE_NAME"`
	// AdvertiseURL is the base URL the gateway reaches this node's API and
	// proxy at; empty: http://<api.listen>, with an unspecified listen host
	// (0.0.0.0) replaced by the first IPv4 address of the host's interfaces.
	AdvertiseURL string `toml:"advertise_url" env:"AENVD_CLUSTER_ADVERTISE_URL"`
	// P2PEndpoint is where peer nodes fetch layers from this one ("": none).
	P2PEndpoint string `toml:"p2p_endpoint" env:"AENVD_CLUSTER_P2P_ENDPOINT"`
	// CPUOvercommit is how many sandbox vCPUs placement may put on each
	// host CPU.
	CPUOvercommit int `toml:"cpu_overcommit" env:"AENVD_CLUSTER_CPU_OVERCOMMIT"`
	// MaxSandboxes bounds the sandboxes placement sends here (0: no bound
	// beyond CPU and memory).
	MaxSandboxes int `toml:"max_sandboxes" env:"AENVD_CLUSTER_MAX_SANDBOXES"`
}

// Image configures OCI pulls and template builds (POST /v3/templates).
type Image struct {
	// DefaultRegistry is used for references without a registry host.
	DefaultRegistry string `toml:"default_registry" env:"AENVD_IMAGE_DEFAULT_REGISTRY"`
	// AllowedRegistries, when not empty, are the only registry hosts
	// (host[:port]) builds may pull from. Environment: comma-separated.
	AllowedRegistries []string `toml:"allowed_registries" env:"AENVD_IMAGE_ALLOWED_REGISTRIES"`
	// InsecureRegistries are reached over plain HTTP (tests, local mirrors).
	InsecureRegistries []string `toml:"insecure_registries" env:"AENVD_IMAGE_INSECURE_REGISTRIES"`
	// CacheDir holds layer blobs and converted root filesystems; default
	// <data_dir>/oci.
	CacheDir string `toml:"cache_dir" env:"AENVD_IMAGE_CACHE_DIR"`
	// RootfsSizeMiB is the ext4 size of a converted image (sparse; the
	// build's RUN steps write into the free space). 0 sizes it from the
	// content (+25% + 64 MiB).
	RootfsSizeMiB int `toml:"rootfs_size_mib" env:"AENVD_IMAGE_ROOTFS_SIZE_MIB"`
	// ReadyTimeout bounds how long a build polls its readyCmd.
	ReadyTimeout Duration `toml:"ready_timeout" env:"AENVD_IMAGE_READY_TIMEOUT"`
	// StepTimeout bounds each build step (a RUN command, a COPY).
	StepTimeout Duration `toml:"step_timeout" env:"AENVD_IMAGE_STEP_TIMEOUT"`
}

// ImageCacheDir is Image.CacheDir or its default.
func (c *Config) ImageCacheDir() string {
	if c.Image.CacheDir != "" {
		return c.Image.CacheDir
	}
	return c.DataDir + "/oci"
}

// Storage chooses where sandbox root disks come from.
type Storage struct {
	// Backend is "storaged" (layered images exported over NBD by
	// aenv-storaged, a process of its own that outlives aenvd: a fresh upper
	// per sandbox, sealed on pause) or "local" (the same daemon run inside
	// aenvd, its state under <data_dir>/storage; "files", its former name,
	// is accepted).
	Backend string `toml:"backend" env:"AENVD_STORAGE_BACKEND"`
	// Socket is aenv-storaged's RPC socket; aenvd starts the daemon when
	// nothing answers there. Default <data_dir>/storaged/storaged.sock.
	Socket string `toml:"socket" env:"AENVD_STORAGE_SOCKET"`
	// Binary is the aenv-storaged executable; default next to aenvd.
	Binary string `toml:"binary" env:"AENVD_STORAGE_BINARY"`
	// PoolLow and PoolHigh are the watermarks of the daemon's warm pool of
	// ready root disks per template (refilled below low, up to high); both
	// zero turns the pool off.
	PoolLow  int `toml:"pool_low" env:"AENVD_STORAGE_POOL_LOW"`
	PoolHigh int `toml:"pool_high" env:"AENVD_STORAGE_POOL_HIGH"`
	// VolumeSizeMiB is the size limit of a volume whose create names none
	// (E2B's SDK never does), 16..65536.
	VolumeSizeMiB int `toml:"volume_size_mib" env:"AENVD_STORAGE_VOLUME_SIZE_MIB"`
	// MemoryDevices maps restored VMs' memory from the daemon's shared
	// read-only ublk device of the memory image's layer stack (one per
	// stack, its pages cached once) instead of a node-local flattened file,
	// where the daemon makes ublk devices and the VMM maps a device (QEMU),
	// or from the daemon's read-only FUSE file of the stack where the daemon
	// exports shared memory that way (SharedMemory). Elsewhere the
	// default has no effect; set explicitly, a node that can make neither
	// refuses to start. On by default.
	MemoryDevices bool `toml:"memory_devices" env:"AENVD_STORAGE_MEMORY_DEVICES"`
	// SharedMemory is how the storage daemon aenvd starts exports shared
	// memory stacks to VMMs (its -shared-block): "auto" (the default) a
	// ublk device where the driver is loaded, else a read-only file on the
	// daemon's FUSE mount, which outlives a crash of the daemon
	// (storage/memfs), else none; "fuse", "ublk" or "none" (memory files
	// are flattened per node) to force one; "" leaves the daemon's own
	// default (ublk, else none). A daemon already running keeps its choice.
	SharedMemory string `toml:"shared_memory" env:"AENVD_STORAGE_SHARED_MEMORY"`
}

// API configures the HTTP listeners.
type API struct {
	// Listen is the control API address; the sandbox proxy also answers here.
	Listen string `toml:"listen" env:"AENVD_API_LISTEN"`
	// ProxyListen is the dedicated sandbox proxy address ("" disables it).
	ProxyListen string `toml:"proxy_listen" env:"AENVD_API_PROXY_LISTEN"`
	// Key is the accepted X-API-Key. Empty: read KeyFile, or generate an
	// e2b_<hex> key there (mode 0600) on first start.
	Key string `toml:"key" env:"AENVD_API_KEY"`
	// KeyFile defaults to <data_dir>/api-key.
	KeyFile string `toml:"key_file" env:"AENVD_API_KEY_FILE"`
	// Domain is reported to SDKs and used for host routing {port}-{id}.{domain}.
	Domain string `toml:"domain" env:"AENVD_API_DOMAIN"`
	// ProxyTLSListen is the sandbox proxy's HTTPS address for host routing
	// ("" disables it): https://{port}-{id}.{domain}, the SDKs' default.
	ProxyTLSListen string `toml:"proxy_tls_listen" env:"AENVD_API_PROXY_TLS_LISTEN"`
	// TLSCert and TLSKey are its certificate for *.{domain}; empty: a
	// local CA in <data_dir>/tls signs one (clients trust tls/ca.pem).
	TLSCert string `toml:"tls_cert" env:"AENVD_API_TLS_CERT"`
	TLSKey  string `toml:"tls_key" env:"AENVD_API_TLS_KEY"`
}

// Network configures sandbox network slots (see package network).
type Network struct {
	// Prefix names the node's namespaces "<prefix>-<n>", host veths
	// "<prefix>v<n>" and nft table (1-8 lower-case letters and digits).
	Prefix string `toml:"prefix" env:"AENVD_NETWORK_PREFIX"`
	// HostCIDR holds one host-interaction address per sandbox slot.
	HostCIDR string `toml:"host_cidr" env:"AENVD_NETWORK_HOST_CIDR"`
	// VethCIDR holds one /31 transit network per slot.
	VethCIDR string `toml:"veth_cidr" env:"AENVD_NETWORK_VETH_CIDR"`
	// PoolLow and PoolHigh are the warm pool of ready slots: refilled up to
	// low in the background; released slots above high are destroyed.
	PoolLow  int `toml:"pool_low" env:"AENVD_NETWORK_POOL_LOW"`
	PoolHigh int `toml:"pool_high" env:"AENVD_NETWORK_POOL_HIGH"`
	// AlwaysDenied lists the CIDRs no sandbox egress policy can open. Empty:
	// the built-in list, every special-purpose block of the IANA IPv4 and
	// IPv6 registries (RFC 6890: private, loopback, link-local and cloud
	// metadata, CGNAT, documentation, benchmarking, multicast, reserved,
	// ...). A list replaces the built-in one. The host's own addresses and
	// the slot ranges are denied in any case.
	AlwaysDenied []string `toml:"always_denied" env:"AENVD_NETWORK_ALWAYS_DENIED"`
	// DNSUpstream is the resolver (IPv4 address, optionally :port) the
	// sandboxes' DNS queries are forwarded to after filtering. Empty: the
	// first IPv4 nameserver of /etc/resolv.conf.
	DNSUpstream string `toml:"dns_upstream" env:"AENVD_NETWORK_DNS_UPSTREAM"`
	// SocketMark is the socket mark (SO_MARK) of aenvd's own connections to
	// sandboxes; only packets carrying it reach sandbox addresses. Choose
	// a value no policy-routing rule of the host uses.
	SocketMark int `toml:"socket_mark" env:"AENVD_NETWORK_SOCKET_MARK"`
	// ConnsPerClient bounds the concurrent connections one client address
	// may hold open to the API and the proxy listeners (slow clients cannot
	// exhaust the server). A gateway in front of the node is one client:
	// raise it there.
	ConnsPerClient int `toml:"conns_per_client" env:"AENVD_NETWORK_CONNS_PER_CLIENT"`
}

// DefaultVMMUIDBase starts the uids confined VMMs run as: far above the
// ranges distributions hand to accounts and to subordinate ids.
const DefaultVMMUIDBase = 2_000_000_000

// maxVMMUIDBase leaves 2^16 slots' uids below the "no id" uid 2^32-1.
const maxVMMUIDBase = 1<<32 - 1 - 1<<16

// VMM chooses the virtual machine monitor.
type VMM struct {
	// Driver is "auto" (Firecracker when its binary runs and /dev/kvm opens,
	// else QEMU with KVM when a test guest boots under it, else QEMU with
	// TCG), "firecracker" or "qemu".
	Driver string `toml:"driver" env:"AENVD_VMM_DRIVER"`
	// Accel forces QEMU's accelerator ("kvm", "tcg"); empty detects.
	Accel string `toml:"accel" env:"AENVD_VMM_ACCEL"`
	// UIDBase confines QEMU: the VMM of the VM in network slot N drops to
	// uid and gid UIDBase+N (no account needed) in a chroot holding only
	// its disks' sockets. Pick a range no account of the host uses; nodes
	// sharing a host need ranges apart. 0 runs VMMs as root.
	UIDBase int `toml:"uid_base" env:"AENVD_VMM_UID_BASE"`
}

// VMMPool is the warm pool of VMM processes: per pooled template, VMMs
// started ahead with a network slot and a root disk, waiting for a create
// to load the template's state into one (docs/performance.md). Needs the
// storaged backend and the QEMU driver; a create that brings drives or
// volumes, or finds no entry ready, restores a VMM of its own.
type VMMPool struct {
	// Low and High are the watermarks per pooled template: below low
	// entries a refill starts in the background and goes on up to high.
	// High 0 turns the pool off (the default: see docs/performance.md for
	// what it saves on a node like the development machine).
	Low  int `toml:"low" env:"AENVD_VMM_POOL_LOW"`
	High int `toml:"high" env:"AENVD_VMM_POOL_HIGH"`
	// ReserveMiB bounds the guest memory of all entries together (each
	// counts its template's); a refill never goes past it. A waiting VMM
	// touches little of it until a create runs its guest.
	ReserveMiB int `toml:"reserve_mib" env:"AENVD_VMM_POOL_RESERVE_MIB"`
	// Templates are the pooled templates, by id or name. Environment:
	// comma-separated.
	Templates []string `toml:"templates" env:"AENVD_VMM_POOL_TEMPLATES"`
}

// Guest sets the resources and assets of the default template.
type Guest struct {
	// VCPUs and MemoryMiB size the VM of the default template "base".
	VCPUs     int `toml:"vcpus" env:"AENVD_GUEST_VCPUS"`
	MemoryMiB int `toml:"memory_mib" env:"AENVD_GUEST_MEMORY_MIB"`
	// Agent is the aenv-agent binary; default: next to the aenvd binary.
	Agent string `toml:"agent" env:"AENVD_GUEST_AGENT"`
	// AssetsCache is guest/image's cache directory; empty: its default.
	AssetsCache string `toml:"assets_cache" env:"AENVD_GUEST_ASSETS_CACHE"`
	// DefaultUser is the user commands run as unless a request names one.
	DefaultUser string `toml:"default_user" env:"AENVD_GUEST_DEFAULT_USER"`
}

// Sandbox holds lifecycle defaults.
type Sandbox struct {
	// DefaultTimeout applies when a create request gives no timeout.
	DefaultTimeout Duration `toml:"default_timeout" env:"AENVD_SANDBOX_DEFAULT_TIMEOUT"`
	// MaxTimeout caps any requested timeout.
	MaxTimeout Duration `toml:"max_timeout" env:"AENVD_SANDBOX_MAX_TIMEOUT"`
	// PauseOnShutdown pauses running sandboxes on a graceful shutdown;
	// otherwise they keep running and the next start takes them over. A
	// shutdown never kills a sandbox: one whose pause fails runs on too.
	PauseOnShutdown bool `toml:"pause_on_shutdown" env:"AENVD_SANDBOX_PAUSE_ON_SHUTDOWN"`
	// MaxLayers is the depth of a paused sandbox's memory or rootfs layer
	// chain above which its own layers are merged in the background.
	MaxLayers int `toml:"max_layers" env:"AENVD_SANDBOX_MAX_LAYERS"`
	// Cgroups confines every VMM in a control group of its own under
	// aenv/<network prefix>, with the sandbox's CPUs, memory (plus the VMM's
	// share) and a pids bound. Needs the cpu, memory and pids controllers
	// (cgroup v2 or v1); turn it off where the node cannot manage them.
	Cgroups bool `toml:"cgroups" env:"AENVD_SANDBOX_CGROUPS"`
	// CgroupDelegated makes those groups under the node's own control group
	// (one its service manager delegated to it: systemd's Delegate=, as
	// deploy/systemd/aenvd.service sets along with this) instead of under
	// each hierarchy's root. On cgroup v2 the node first moves itself into
	// the leaf aenvd below its group.
	CgroupDelegated bool `toml:"cgroup_delegated" env:"AENVD_SANDBOX_CGROUP_DELEGATED"`
	// Prefetch reads a memory image's working set (the pages the first VM
	// created from it touched until its agent answered, recorded then)
	// into the page cache while a VM restores from it: on a cold cache the
	// guest's page faults wait less on the disk. Off by default: on a node
	// whose memory files sit on a fast local disk (bench/aenvd measures
	// cold-cache creates both ways) it did not pay. A stack brought from
	// the repository whose layers are read lazily has its working set
	// pushed either way, before its guest runs.
	Prefetch bool `toml:"prefetch" env:"AENVD_SANDBOX_PREFETCH"`
	// FlattenPaused flattens a paused sandbox's memory image (the template's
	// memory with the layers of its pauses above it) into one file in the
	// background, so that its resume maps that file instead of writing the
	// layers into the new VM's RAM first. It costs the disk space of the
	// image's non-zero pages per paused sandbox.
	FlattenPaused bool `toml:"flatten_paused" env:"AENVD_SANDBOX_FLATTEN_PAUSED"`
}

// Duration is a time.Duration written as "15s", "1h" in TOML.
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Default returns the documented defaults.
func Default() Config {
	return Config{
		DataDir: "/var/lib/aenv",
		API:     API{Listen: "127.0.0.1:3000", ProxyListen: "127.0.0.1:3001", Domain: "localhost"},
		Network: Network{Prefix: "aenv", HostCIDR: "10.11.0.0/16", VethCIDR: "10.12.0.0/16", PoolLow: 2, PoolHigh: 8,
			AlwaysDenied: []string{}, SocketMark: 0x61650000, ConnsPerClient: 512}, // network.DefaultSocketMark
		VMM:     VMM{Driver: "auto", UIDBase: DefaultVMMUIDBase},
		VMMPool: VMMPool{ReserveMiB: 2048, Templates: []string{"base"}},
		Guest:   Guest{VCPUs: 1, MemoryMiB: 512, DefaultUser: "user"},
		Storage: Storage{Backend: "storaged", PoolLow: 2, PoolHigh: 4, VolumeSizeMiB: 1024, MemoryDevices: true, SharedMemory: "auto"},
		Image: Image{DefaultRegistry: "docker.io", AllowedRegistries: []string{}, InsecureRegistries: []string{},
			RootfsSizeMiB: 2048, ReadyTimeout: Duration{5 * time.Minute}, StepTimeout: Duration{30 * time.Minute}},
		Cluster: Cluster{Scheduler: []string{}, CPUOvercommit: 4},
		Admission: Admission{MaxSandboxes: 64, MemoryOvercommitPct: 100, HostReserveMiB: 2048, DiskReserveMiB: 2048,
			MaxForkChildren: 16, MaxConnections: 4096},
		Sandbox: Sandbox{
			DefaultTimeout:  Duration{15 * time.Second},
			MaxTimeout:      Duration{24 * time.Hour},
			PauseOnShutdown: true,
			MaxLayers:       32,
			FlattenPaused:   true,
			Cgroups:         true,
		},
		Repository: Repository{Backend: "none", UploadConcurrency: 2, ChunkSizeKiB: 256, CacheMiB: 256, LazyRootfs: true,
			LayerWait: Duration{5 * time.Minute}, GCGrace: Duration{time.Hour}, GCInterval: Duration{6 * time.Hour}, LeaseTTL: Duration{10 * time.Minute}, Peers: []string{}},
	}
}

// Load reads path (if not empty) over the defaults, then applies the
// environment overrides, then validates.
func Load(path string) (Config, error) {
	c := Default()
	if path != "" {
		md, err := toml.DecodeFile(path, &c)
		if err != nil {
			return c, fmt.Errorf("load config %s: %w", path, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			return c, fmt.Errorf("load config %s: unknown keys %v", path, und)
		}
	}
	if err := applyEnv(reflect.ValueOf(&c).Elem(), os.LookupEnv); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate checks values that have no meaningful zero.
func (c *Config) Validate() error {
	switch {
	case c.DataDir == "":
		return fmt.Errorf("config: data_dir is empty")
	case c.API.Listen == "":
		return fmt.Errorf("config: api.listen is empty")
	case !slices.Contains([]string{"", "auto", "fuse", "ublk", "none"}, c.Storage.SharedMemory):
		return fmt.Errorf("config: storage.shared_memory %q: want auto, fuse, ublk, none or empty", c.Storage.SharedMemory)
	case c.Storage.Backend != "storaged" && c.Storage.Backend != "local" && c.Storage.Backend != "files":
		return fmt.Errorf("config: storage.backend %q: want storaged or local", c.Storage.Backend)
	case c.VMM.UIDBase < 0 || c.VMM.UIDBase > maxVMMUIDBase:
		return fmt.Errorf("config: vmm.uid_base %d: want 0 (VMMs run as root) up to %d (room for every slot's uid)", c.VMM.UIDBase, maxVMMUIDBase)
	case c.VMM.Driver != "auto" && c.VMM.Driver != "qemu" && c.VMM.Driver != "firecracker":
		return fmt.Errorf("config: vmm.driver %q: want auto, firecracker or qemu", c.VMM.Driver)
	case c.Sandbox.MaxLayers < 2 || c.Sandbox.MaxLayers > 200:
		return fmt.Errorf("config: sandbox.max_layers %d is not within 2..200", c.Sandbox.MaxLayers)
	case c.Guest.VCPUs < 1 || c.Guest.MemoryMiB < 64:
		return fmt.Errorf("config: guest needs at least 1 vcpu and 64 MiB (got %d, %d)", c.Guest.VCPUs, c.Guest.MemoryMiB)
	case c.Image.RootfsSizeMiB < 0 || c.Image.ReadyTimeout.Duration <= 0 || c.Image.StepTimeout.Duration <= 0:
		return fmt.Errorf("config: image: rootfs_size_mib must not be negative, ready_timeout and step_timeout must be positive")
	case c.Storage.VolumeSizeMiB < 16 || c.Storage.VolumeSizeMiB > 64<<10:
		return fmt.Errorf("config: storage.volume_size_mib %d: want 16..65536", c.Storage.VolumeSizeMiB)
	case c.VMMPool.High > 0 && (c.VMMPool.Low < 1 || c.VMMPool.High < c.VMMPool.Low) || c.VMMPool.High < 0 || c.VMMPool.ReserveMiB < 0:
		return fmt.Errorf("config: vmm_pool watermarks: want high 0 (off) or 1 <= low (%d) <= high (%d), and reserve_mib (%d) not negative",
			c.VMMPool.Low, c.VMMPool.High, c.VMMPool.ReserveMiB)
	case c.Storage.PoolLow < 0 || c.Storage.PoolHigh < c.Storage.PoolLow:
		return fmt.Errorf("config: storage pool watermarks: want 0 <= pool_low (%d) <= pool_high (%d)", c.Storage.PoolLow, c.Storage.PoolHigh)
	case c.Network.SocketMark <= 0 || c.Network.SocketMark > 0xffffffff || c.Network.ConnsPerClient < 1:
		return fmt.Errorf("config: network: socket_mark must be within 1..0xffffffff and conns_per_client at least 1")
	case c.Admission.validate() != nil:
		return c.Admission.validate()
	case c.Cluster.CPUOvercommit < 1 || c.Cluster.MaxSandboxes < 0:
		return fmt.Errorf("config: cluster: cpu_overcommit must be at least 1 and max_sandboxes not negative")
	case c.Sandbox.DefaultTimeout.Duration <= 0 || c.Sandbox.MaxTimeout.Duration < c.Sandbox.DefaultTimeout.Duration:
		return fmt.Errorf("config: sandbox timeouts: default %s must be positive and at most max %s",
			c.Sandbox.DefaultTimeout, c.Sandbox.MaxTimeout)
	}
	return c.Repository.validate()
}

// KeyFilePath is API.KeyFile or its default.
func (c *Config) KeyFilePath() string {
	if c.API.KeyFile != "" {
		return c.API.KeyFile
	}
	return c.DataDir + "/api-key"
}

// Encode writes c as plain TOML (EncodeDocumented adds the documentation).
func (c Config) Encode() (string, error) {
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(c); err != nil {
		return "", fmt.Errorf("encode config: %w", err)
	}
	return b.String(), nil
}

var durationType = reflect.TypeOf(Duration{})

func applyEnv(v reflect.Value, lookup func(string) (string, bool)) error {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			if err := applyEnv(fv, lookup); err != nil {
				return err
			}
			continue
		}
		name := f.Tag.Get("env")
		s, ok := lookup(name)
		if name == "" || !ok {
			continue
		}
		if err := setField(fv, s); err != nil {
			return fmt.Errorf("config: environment %s=%q: %w", name, s, err)
		}
	}
	return nil
}

func setField(fv reflect.Value, s string) error {
	if fv.Type() == durationType {
		return fv.Addr().Interface().(*Duration).UnmarshalText([]byte(s))
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Int:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		fv.SetInt(int64(n))
	case reflect.Slice:
		if fv.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("unsupported list kind %s", fv.Type().Elem().Kind())
		}
		list := []string{}
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				list = append(list, item)
			}
		}
		fv.Set(reflect.ValueOf(list))
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		fv.SetBool(b)
	default:
		return fmt.Errorf("unsupported field kind %s", fv.Kind())
	}
	return nil
}

// IsSet reports whether the configuration at path (if not empty) or the
// environment sets the key named by section and key; a default a node
// cannot honour is ignored, a setting it cannot honour is refused.
func IsSet(path, section, key string) (bool, error) {
	if env := envName(reflect.TypeOf(Config{}), section, key); env != "" {
		if _, ok := os.LookupEnv(env); ok {
			return true, nil
		}
	}
	if path == "" {
		return false, nil
	}
	var c Config
	md, err := toml.DecodeFile(path, &c)
	if err != nil {
		return false, fmt.Errorf("load config %s: %w", path, err)
	}
	return md.IsDefined(section, key), nil
}

// envName is the environment variable of section.key in t, or "".
func envName(t reflect.Type, section, key string) string {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("toml") != section || f.Type.Kind() != reflect.Struct {
			continue
		}
		for j := range f.Type.NumField() {
			if g := f.Type.Field(j); g.Tag.Get("toml") == key {
				return g.Tag.Get("env")
			}
		}
	}
	return ""
}
