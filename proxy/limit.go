package proxy

import (
	"net"
	"net/netip"
	"sync"
)

// LimitPerClient wraps l so that one client address holds at most max
// connections at a time; a connection above that is closed as soon as it
// is accepted. It bounds what slow clients (slowloris) can tie up, on the
// API listener as on the proxy's.
func LimitPerClient(l net.Listener, max int) net.Listener {
	return LimitConnections(l, max, 0)
}

// LimitConnections is LimitPerClient that also holds at most total
// connections of all clients together (0: no such limit), so that many
// addresses, or one address every local client shares, cannot exhaust the
// node's descriptors and goroutines.
func LimitConnections(l net.Listener, perClient, total int) net.Listener {
	return &limitListener{Listener: l, max: perClient, total: total, open: map[netip.Addr]int{}}
}

type limitListener struct {
	net.Listener
	max, total int

	mu   sync.Mutex
	open map[netip.Addr]int
	sum  int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientAddr(c)
		l.mu.Lock()
		if l.open[ip] >= l.max || l.total > 0 && l.sum >= l.total {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[ip]++
		l.sum++
		l.mu.Unlock()
		return &limitedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *limitListener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sum--
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

// clientAddr is the remote IP (IPv4-mapped IPv6 unmapped, so one client
// counts once); the zero Addr for non-IP connections (all of them share
// one budget).
func clientAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
