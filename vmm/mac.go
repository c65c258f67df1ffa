package vmm

import (
	"crypto/rand"
	"fmt"
	"net"
)

// ParseMAC accepts a 6-byte unicast Ethernet address.
func ParseMAC(s string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return nil, fmt.Errorf("mac %q: %w", s, err)
	}
	if len(hw) != 6 {
		return nil, fmt.Errorf("mac %q: want 6 bytes, got %d", s, len(hw))
	}
	if hw[0]&1 != 0 {
		return nil, fmt.Errorf("mac %q: multicast address", s)
	}
	return hw, nil
}

// RandomMAC returns a locally administered unicast address.
func RandomMAC() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	b[0] = (b[0] | 0x02) &^ 0x01
	return net.HardwareAddr(b).String()
}
