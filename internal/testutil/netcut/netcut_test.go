package netcut

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo serves one line back per line on a loopback port.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// While cut, nothing crosses the link on an open connection nor on a new
// one (the peer sees silence, no reset); restored, the held bytes arrive.
func TestCutHoldsRestoreDelivers(t *testing.T) {
	l, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) {
		t.Helper()
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != msg+"\n" {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
	roundTrip("before")

	l.Cut()
	if _, err := c.Write([]byte("during\n")); err != nil {
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp", l.Addr()) // accepted, held
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	for _, conn := range []net.Conn{c, c2} {
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b := make([]byte, 16)
		if n, err := conn.Read(b); n != 0 || err == nil {
			t.Fatalf("read through a cut link: %q %v, want a timeout", b[:n], err)
		} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("read through a cut link: %v, want a timeout (no reset, no close)", err)
		}
		_ = conn.SetReadDeadline(time.Time{})
	}

	l.Restore()
	if got, err := r.ReadString('\n'); err != nil || got != "during\n" {
		t.Fatalf("the line held while cut: %q %v", got, err)
	}
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("the connection opened while cut: %q %v", got, err)
	}
	roundTrip("after")
}
