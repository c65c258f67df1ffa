// Package netcut is a TCP forwarder on loopback that a test can cut and
// restore, to partition one process from another the way a network does:
// while cut, bytes already in flight stop (nothing is reset or closed: the
// peers see silence and their own timeouts fire) and new connections are
// accepted but go nowhere; once restored, held bytes and connections flow
// on, as after a healed partition with TCP's retransmissions.
package netcut

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Link forwards connections to its Addr on to a target.
type Link struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  chan struct{} // closed while traffic flows
	conns map[net.Conn]struct{}
	done  bool
}

// Listen starts a link on a free loopback port to target (host:port).
func Listen(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netcut: listen for %s: %w", target, err)
	}
	l := &Link{ln: ln, target: target, open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(l.open)
	go l.accept()
	return l, nil
}

// Addr is where to connect instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut stops all traffic through the link until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default: // already cut
	}
}

// Restore lets traffic flow again.
func (l *Link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}

// Close stops the link and closes every connection through it.
func (l *Link) Close() error {
	l.mu.Lock()
	l.done = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.Restore() // release the copies waiting to write
	return l.ln.Close()
}

// flowing waits until traffic may flow; false once the link is closed.
func (l *Link) flowing() bool {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	<-open
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.done
}

func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.serve(c)
	}
}

// serve connects c to the target once traffic flows and copies both ways.
func (l *Link) serve(c net.Conn) {
	if !l.track(c) || !l.flowing() {
		_ = c.Close()
		return
	}
	up, err := net.Dial("tcp", l.target)
	if err != nil {
		_ = c.Close() // the target is down: the peer sees a closed connection
		return
	}
	if !l.track(up) {
		_ = c.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.copy(up, c) }()
	go func() { defer wg.Done(); l.copy(c, up) }()
	wg.Wait()
	l.mu.Lock()
	delete(l.conns, c)
	delete(l.conns, up)
	l.mu.Unlock()
	_ = c.Close()
	_ = up.Close()
}

// copy moves bytes from src to dst, holding each chunk while the link is
// cut; the end of src half-closes dst.
func (l *Link) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.flowing() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && l.flowing() { // a FIN waits for the link too
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			return
		}
	}
}
