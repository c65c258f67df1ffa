package clusterbench

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// startRelay is a TCP relay to target on a loopback port: what any proxy
// hop costs at the least. It parses nothing, and its io.Copy between two
// TCP connections is the kernel's splice(2), the bytes never reaching
// user space; the gateway's figures are set beside it to tell the cost of
// a second connection on the same cores from the gateway's own.
func startRelay(b *testing.B, target string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(c.(*net.TCPConn), target)
		}
	}()
	return "http://" + ln.Addr().String()
}

func relay(c *net.TCPConn, target string) {
	defer c.Close()
	u, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer u.Close()
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(c, u)
}

// cpuTime is the CPU this process used so far, user and system: the
// client, the origin and whatever is between them all run in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
