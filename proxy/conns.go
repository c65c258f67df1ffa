package proxy

import (
	"net"
	"sync"
)

// conns tracks the proxy's open upstream connections by sandbox, so a
// sandbox's end can close them: a VM that is stopped sends no FIN or RST,
// and without this a client's command stream would hang until its own
// timeout instead of failing at once.
type conns struct {
	mu   sync.Mutex
	byID map[string]map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	set  *conns
	id   string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}

func (s *conns) track(id string, c net.Conn) net.Conn {
	tc := &trackedConn{Conn: c, set: s, id: id}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]map[*trackedConn]struct{}{}
	}
	if s.byID[id] == nil {
		s.byID[id] = map[*trackedConn]struct{}{}
	}
	s.byID[id][tc] = struct{}{}
	return tc
}

func (s *conns) remove(c *trackedConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID[c.id], c)
	if len(s.byID[c.id]) == 0 {
		delete(s.byID, c.id)
	}
}

// closeAll closes every upstream connection to the sandbox id.
func (s *conns) closeAll(id string) int {
	s.mu.Lock()
	list := make([]*trackedConn, 0, len(s.byID[id]))
	for c := range s.byID[id] {
		list = append(list, c)
	}
	s.mu.Unlock()
	for _, c := range list {
		_ = c.Close()
	}
	return len(list)
}

// open is how many upstream connections to id are open.
func (s *conns) open(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID[id])
}

// Ended closes the upstream connections of a sandbox that was killed or
// paused, so its streams end now (the SDK then finds the sandbox gone and
// reports it); event names what ended it, for the log. It never blocks.
func (p *Proxy) Ended(id, event string) {
	if n := p.conns.closeAll(id); n > 0 {
		p.log.Debug("closed the streams of a sandbox that ended", "sandbox", id, "event", event, "conns", n)
	}
}
