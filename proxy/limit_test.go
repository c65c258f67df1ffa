package proxy

import (
	"net"
	"testing"
	"time"
)

// TestLimitConnectionsTotal: besides the per-address limit, the listener
// holds at most total connections of all addresses together, and a closed
// one frees a place.
func TestLimitConnectionsTotal(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConnections(inner, 2, 3)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var held []net.Conn
	for _, src := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		dialFrom(src)
		held = append(held, <-accepted)
	}
	extra := dialFrom("127.0.0.4") // a fresh address, over the total
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection above the total was kept open")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection above the total was neither accepted nor closed")
	}
	held[0].Close()
	dialFrom("127.0.0.5")
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("closing a connection did not free a place under the total")
	}
}
