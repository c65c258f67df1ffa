package initd

import (
	"fmt"
	"net/netip"
	"strings"
)

// Cmdline is what PID 1 reads from /proc/cmdline.
type Cmdline struct {
	Root       string // root=, default /dev/vda; "none" stays in the initramfs
	RootFSType string // rootfstype=, default ext4
	ReadOnly   bool   // "ro" given
	Hostname   string // aenv.hostname=
	DNS        []string
	IP         *IPConfig // ip=
	AgentArgs  []string  // aenv.agent_args= (comma separated), extra flags for the agent
	Raw        map[string]string
}

// IPConfig is the kernel's `ip=<client>::<gw>:<netmask>:<hostname>:<device>:<autoconf>` form,
// limited to static configuration.
type IPConfig struct {
	Address netip.Prefix
	Gateway netip.Addr // may be invalid (no default route)
	Device  string
}

// ParseCmdline parses a kernel command line. Unknown words are kept in Raw.
func ParseCmdline(s string) (*Cmdline, error) {
	c := &Cmdline{Root: "/dev/vda", RootFSType: "ext4", Raw: map[string]string{}}
	for _, word := range strings.Fields(s) {
		key, val, _ := strings.Cut(word, "=")
		c.Raw[key] = val
		var err error
		switch key {
		case "root":
			c.Root = val
		case "rootfstype":
			c.RootFSType = val
		case "ro":
			c.ReadOnly = true
		case "rw":
			c.ReadOnly = false
		case "aenv.hostname":
			c.Hostname = val
		case "aenv.dns":
			c.DNS = splitNonEmpty(val)
		case "aenv.agent_args":
			c.AgentArgs = splitNonEmpty(val)
		case "ip":
			c.IP, err = ParseIPConfig(val)
		}
		if err != nil {
			return nil, fmt.Errorf("kernel command line %q: %w", word, err)
		}
	}
	return c, nil
}

// ParseIPConfig parses the static subset of the kernel's ip= parameter.
func ParseIPConfig(v string) (*IPConfig, error) {
	f := strings.Split(v, ":")
	if len(f) < 4 {
		return nil, fmt.Errorf("ip=%s: want <client>::<gw>:<netmask>[:<host>:<dev>:off]", v)
	}
	addr, err := netip.ParseAddr(f[0])
	if err != nil || !addr.Is4() {
		return nil, fmt.Errorf("ip=%s: bad client address %q", v, f[0])
	}
	mask, err := netip.ParseAddr(f[3])
	if err != nil || !mask.Is4() {
		return nil, fmt.Errorf("ip=%s: bad netmask %q", v, f[3])
	}
	bits, err := maskBits(mask)
	if err != nil {
		return nil, fmt.Errorf("ip=%s: %w", v, err)
	}
	cfg := &IPConfig{Address: netip.PrefixFrom(addr, bits), Device: "eth0"}
	if f[2] != "" {
		gw, err := netip.ParseAddr(f[2])
		if err != nil || !gw.Is4() {
			return nil, fmt.Errorf("ip=%s: bad gateway %q", v, f[2])
		}
		cfg.Gateway = gw
	}
	if len(f) > 5 && f[5] != "" {
		cfg.Device = f[5]
	}
	if len(f) > 6 && f[6] != "" && f[6] != "off" && f[6] != "none" {
		return nil, fmt.Errorf("ip=%s: only static configuration (autoconf off) is supported", v)
	}
	return cfg, nil
}

func maskBits(m netip.Addr) (int, error) {
	b := m.As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	bits := 0
	for n&0x80000000 != 0 {
		bits++
		n <<= 1
	}
	if n != 0 {
		return 0, fmt.Errorf("netmask %s is not contiguous", m)
	}
	return bits, nil
}

func splitNonEmpty(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}
