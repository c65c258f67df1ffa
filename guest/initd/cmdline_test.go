package initd

import (
	"net/netip"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	t.Parallel()
	c, err := ParseCmdline("console=ttyS0 root=/dev/vdb ro ip=169.254.0.21::169.254.0.22:255.255.255.252::eth0:off aenv.hostname=sbx aenv.dns=1.1.1.1,8.8.8.8 quiet\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Root != "/dev/vdb" || !c.ReadOnly || c.Hostname != "sbx" || len(c.DNS) != 2 {
		t.Fatalf("parsed %+v", c)
	}
	if c.IP == nil || c.IP.Address != netip.MustParsePrefix("169.254.0.21/30") || c.IP.Gateway != netip.MustParseAddr("169.254.0.22") || c.IP.Device != "eth0" {
		t.Fatalf("ip %+v", c.IP)
	}
	if _, ok := c.Raw["quiet"]; !ok {
		t.Fatal("unknown words must be kept")
	}
}

func TestParseIPConfigErrors(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "1.2.3.4", "x::1.1.1.1:255.0.0.0", "10.0.0.1::10.0.0.2:255.0.255.0", "10.0.0.1::nope:255.0.0.0", "10.0.0.1::::", "10.0.0.1::10.0.0.2:255.255.255.0::eth0:dhcp"} {
		if _, err := ParseIPConfig(v); err == nil {
			t.Errorf("ParseIPConfig(%q): want error", v)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add("root=/dev/vda ip=10.0.0.2::10.0.0.1:255.255.255.0::eth0:off")
	f.Add("ip=:::::::")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCmdline(s)
		if err == nil && c.IP != nil && !c.IP.Address.IsValid() {
			t.Fatalf("valid result with invalid address: %q", s)
		}
	})
}
