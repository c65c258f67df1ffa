package main

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestListenLimitsConnectionsPerClient: one client address holds at most
// the configured connections; one more is closed at once, and a slot freed
// is taken again.
func TestListenLimitsConnectionsPerClient(t *testing.T) {
	if _, err := listen("127.0.0.1:0", 0); err == nil {
		t.Fatal("a limit of 0 connections was taken")
	}
	ln, err := listen("127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }() // echo until the client closes
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	echoes := func(c net.Conn) bool {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return false
		}
		b := make([]byte, 1)
		_, err := io.ReadFull(c, b)
		return err == nil
	}
	a, b := dial(), dial()
	defer a.Close()
	if !echoes(a) || !echoes(b) {
		t.Fatal("a connection within the limit is not served")
	}
	if c := dial(); echoes(c) {
		t.Fatal("a third connection from one address was served with a limit of 2")
	}
	b.Close()
	// The slot frees once the server has seen the close: wait for that.
	for deadline := time.Now().Add(5 * time.Second); ; {
		d := dial()
		ok := echoes(d)
		d.Close()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a freed slot is not taken again")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
