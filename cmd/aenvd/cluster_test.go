package main

import (
	"net"
	"testing"
)

func TestAdvertiseAddr(t *testing.T) {
	if got := advertiseAddr("10.1.2.3:3000", "aenv"); got != "10.1.2.3:3000" {
		t.Fatalf("a specific listen address: %q", got)
	}
	got := advertiseAddr("0.0.0.0:3000", "aenv")
	host, port, err := net.SplitHostPort(got)
	if err != nil || port != "3000" {
		t.Fatalf("advertise of 0.0.0.0:3000: %q (%v)", got, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsLoopback() || (ip.IsUnspecified() && hasIPv4(t)) {
		t.Fatalf("advertise of 0.0.0.0:3000: %q, want the host's first IPv4 address", got)
	}
}

// hasIPv4 reports whether some interface but loopback has an IPv4 address.
func hasIPv4(t *testing.T) bool {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && ifc.Flags&net.FlagUp != 0 {
				return true
			}
		}
	}
	return false
}
