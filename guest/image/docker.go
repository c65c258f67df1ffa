package image

// What a guest running Docker Engine needs of the kernel, for the variant
// of compose sandboxes (composeguest; docs/architecture.md, Compose
// sandboxes). Debian's cloud kernel has all of it, the networking parts as
// modules, which the variant's tree gets (Variant.Modules) beside the
// initramfs's DefaultModules.
var (
	// DockerModules are the modules dockerd's bridge networks need with
	// Debian's iptables (the nft backend), dependencies left to
	// kernelpkg.ResolveModules: xt_tcpudp for the port matches of a
	// published port's rules, comment, mark and multiport for the rules
	// projects' own containers commonly add. overlay (the overlay2 storage
	// driver) is among DefaultModules already.
	DockerModules = []string{"bridge", "br_netfilter", "veth", "nf_tables", "nft_compat", "nft_chain_nat",
		"nf_nat", "nf_conntrack", "xt_MASQUERADE", "xt_addrtype", "xt_conntrack", "xt_nat", "xt_tcpudp", "xt_comment", "xt_mark", "xt_multiport", "overlay"}
	// DockerKernelConfig are the kernel options Docker needs, each built in
	// or a module.
	DockerKernelConfig = []string{"NAMESPACES", "NET_NS", "PID_NS", "IPC_NS", "UTS_NS", "USER_NS", "CGROUPS",
		"MEMCG", "CGROUP_PIDS", "CPUSETS", "CGROUP_DEVICE", "CGROUP_BPF", "CGROUP_FREEZER", "SECCOMP", "SECCOMP_FILTER",
		"KEYS", "POSIX_MQUEUE", "OVERLAY_FS", "BRIDGE", "BRIDGE_NETFILTER", "VETH", "NETFILTER", "NF_TABLES",
		"NFT_COMPAT", "NF_NAT", "NF_CONNTRACK", "NETFILTER_XT_TARGET_MASQUERADE", "NETFILTER_XT_MATCH_ADDRTYPE",
		"NETFILTER_XT_MATCH_CONNTRACK", "IP_NF_IPTABLES", "IP_NF_NAT", "IP_NF_FILTER"}
)
