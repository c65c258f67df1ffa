package proxy

import (
	"net"
	"sync"

	"github.com/agentenv/agentenv/orchestrator"
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

// OnEvent takes the orchestrator's lifecycle events (Subscribe): when a
// sandbox is killed or paused its upstream connections are closed, so its
// streams end now (the SDK then finds the sandbox gone and reports it).
// It never blocks.
func (p *Proxy) OnEvent(ev orchestrator.Event) {
	if ev.Type != orchestrator.EventKilled && ev.Type != orchestrator.EventPaused {
		return
	}
	if n := p.conns.closeAll(ev.SandboxID); n > 0 {
		p.log.Debug("closed the streams of a sandbox that ended", "sandbox", ev.SandboxID, "event", ev.Type, "conns", n)
	}
}
