package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The slot's DNS-aware resolver. Domain rules need something that sees
// names; a resolver does, without putting a process in the data path of
// every connection. It listens at NameserverIP:53 inside the slot; the slot
// redirects every DNS packet of the guest to it. For each query it:
//
//   - refuses names no rule allows when the policy denies the internet (so
//     DNS is not a way out either);
//   - forwards the rest, from the host namespace, to the node's upstream;
//   - before answering a name an AllowOut domain covers, adds the answer's
//     IPv4 addresses to the slot's dns_allow set for the record's TTL
//     (clamped), so the guest's connection that follows is accepted.
//
// Known limits: an address allowed for one name is allowed for every name
// it serves (shared CDN addresses); a guest that learned an address while
// it was allowed keeps established connections after the entry expires.

const (
	dnsMinTTL      = 60 * time.Second
	dnsMaxTTL      = time.Hour
	dnsMaxRecords  = 8192 // per slot, bounds what one guest can add
	dnsMaxInflight = 64   // concurrent queries per slot
	dnsTimeout     = 3 * time.Second
	dnsRenewMargin = 2 * time.Second // policy replacement drops entries this close to expiry
)

type dnsRecord struct {
	name    string
	expires time.Time
}

type resolver struct {
	s      *Slot
	udp    *net.UDPConn
	tcp    *net.TCPListener
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu      sync.Mutex
	records map[netip.Addr]dnsRecord
}

func newResolver(s *Slot) *resolver {
	return &resolver{s: s, sem: make(chan struct{}, dnsMaxInflight), records: map[netip.Addr]dnsRecord{}}
}

// listen opens the resolver's sockets; call it on a thread inside the slot.
func (r *resolver) listen() error {
	addr := netip.AddrPortFrom(NameserverIP, 53)
	u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return fmt.Errorf("listen dns udp %s: %w", addr, err)
	}
	t, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		u.Close()
		return fmt.Errorf("listen dns tcp %s: %w", addr, err)
	}
	r.udp, r.tcp = u, t
	return nil
}

func (r *resolver) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.wg.Add(2)
	go r.serveUDP(ctx)
	go r.serveTCP(ctx)
}

func (r *resolver) close() {
	if r.cancel != nil {
		r.cancel()
	}
	if r.udp != nil {
		r.udp.Close()
	}
	if r.tcp != nil {
		r.tcp.Close()
	}
	r.wg.Wait()
}

// reset forgets every resolved address (the set itself is flushed by the
// policy replacement that follows).
func (r *resolver) reset() {
	r.mu.Lock()
	clear(r.records)
	r.mu.Unlock()
}

func (r *resolver) serveUDP(ctx context.Context) {
	defer r.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := r.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !r.acquire() {
			continue // overloaded: drop, the guest retries
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			defer r.release()
			if resp := r.handle(ctx, "udp", q); resp != nil {
				r.udp.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (r *resolver) serveTCP(ctx context.Context) {
	defer r.wg.Done()
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !r.acquire() {
			c.Close()
			continue
		}
		go func() {
			defer r.release()
			defer c.Close()
			r.serveTCPConn(ctx, c)
		}()
	}
}

func (r *resolver) serveTCPConn(ctx context.Context, c net.Conn) {
	for range 16 { // a few pipelined queries per connection
		c.SetDeadline(time.Now().Add(10 * time.Second))
		q, err := readTCPMsg(c)
		if err != nil {
			return
		}
		resp := r.handle(ctx, "tcp", q)
		if resp == nil || writeTCPMsg(c, resp) != nil {
			return
		}
	}
}

func (r *resolver) acquire() bool {
	select {
	case r.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (r *resolver) release() { <-r.sem }

// handle answers one query from the guest; nil means no answer.
func (r *resolver) handle(ctx context.Context, network string, q []byte) []byte {
	qname, ok := questionName(q)
	if !ok {
		return nil
	}
	pol := r.s.currentPolicy()
	allowed := pol.allowsName(qname)
	if pol.denyInternet && !allowed {
		return errorReply(q, dnsmessage.RCodeRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	resp, err := r.exchange(ctx, network, q)
	if err != nil {
		r.s.m.log.Debug("dns upstream", "slot", r.s.Name, "name", qname, "err", err)
		return errorReply(q, dnsmessage.RCodeServerFailure)
	}
	if !allowed {
		return resp
	}
	if addrs := answerAddrs(resp); len(addrs) > 0 {
		if err := r.s.allowResolved(qname, addrs); err != nil {
			r.s.m.log.Warn("dns allow", "slot", r.s.Name, "name", qname, "err", err)
			return errorReply(q, dnsmessage.RCodeServerFailure)
		}
	}
	return resp
}

// exchange forwards q to the upstream from the host namespace.
func (r *resolver) exchange(ctx context.Context, network string, q []byte) ([]byte, error) {
	c, err := r.s.m.dialHost(ctx, network, r.s.m.cfg.DNSUpstream.String(), false)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var resp []byte
	if network == "tcp" {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		resp, err = readTCPMsg(c)
	} else {
		if _, err := c.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		var n int
		n, err = c.Read(buf)
		resp = buf[:n]
	}
	if err != nil {
		return nil, err
	}
	if len(resp) < 12 || resp[0] != q[0] || resp[1] != q[1] {
		return nil, errors.New("upstream answer does not match the query")
	}
	return resp, nil
}

// allowResolved adds addrs (address -> TTL) to the slot's dns_allow set.
func (s *Slot) allowResolved(name string, addrs map[netip.Addr]time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.policy.allowsName(name) {
		return nil // the policy changed meanwhile
	}
	r := s.dns
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	add := map[netip.Addr]time.Duration{}
	for a, ttl := range addrs {
		rec, known := r.records[a]
		left := rec.expires.Sub(now)
		switch {
		case known && left > ttl/2:
			continue // fresh enough: no churn on every query
		case known && left > 0:
			// Re-adding an element does not renew its timeout on every
			// kernel: delete it first. It may have expired meanwhile,
			// so this is its own batch and its error is ignored.
			if c, err := s.nft(); err == nil {
				c.SetDeleteElements(s.table.dnsAllow, dnsElements(map[netip.Addr]time.Duration{a: ttl}))
				c.Flush()
			}
		case !known && len(r.records) >= dnsMaxRecords:
			continue
		}
		add[a] = ttl
	}
	if len(add) == 0 {
		return nil
	}
	c, err := s.nft()
	if err != nil {
		return err
	}
	if err := c.SetAddElements(s.table.dnsAllow, dnsElements(add)); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add resolved addresses of %s to slot %s: %w", name, s.Name, err)
	}
	for a, ttl := range add {
		r.records[a] = dnsRecord{name: name, expires: now.Add(ttl)}
	}
	return nil
}

// keepFor returns the resolved addresses still allowed under p with their
// remaining lifetime, and forgets the others. Called with s.mu held.
func (r *resolver) keepFor(p *compiledPolicy) map[netip.Addr]time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	keep := map[netip.Addr]time.Duration{}
	for a, rec := range r.records {
		left := rec.expires.Sub(now)
		if left <= dnsRenewMargin || !p.allowsName(rec.name) {
			delete(r.records, a)
			continue
		}
		keep[a] = left.Truncate(time.Millisecond)
	}
	return keep
}

// ---- DNS message helpers (inputs are untrusted) ----

// questionName returns the name of a query's single question.
func questionName(q []byte) (string, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return "", false
	}
	question, err := p.Question()
	if err != nil {
		return "", false
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return "", false // exactly one question
	}
	return question.Name.String(), true
}

// errorReply builds an empty answer with rcode to query q.
func errorReply(q []byte, rcode dnsmessage.RCode) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true, RCode: rcode,
	})
	if b.StartQuestions() != nil || b.Question(question) != nil {
		return nil
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// answerAddrs returns the IPv4 addresses of a successful answer, with
// their TTLs clamped to [dnsMinTTL, dnsMaxTTL].
func answerAddrs(resp []byte) map[netip.Addr]time.Duration {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || !h.Response || h.RCode != dnsmessage.RCodeSuccess {
		return nil
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil
	}
	out := map[netip.Addr]time.Duration{}
	for {
		ah, err := p.AnswerHeader()
		if err != nil {
			return out
		}
		if ah.Type != dnsmessage.TypeA || ah.Class != dnsmessage.ClassINET {
			if p.SkipAnswer() != nil {
				return out
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return out
		}
		ttl := min(max(time.Duration(ah.TTL)*time.Second, dnsMinTTL), dnsMaxTTL)
		addr := netip.AddrFrom4(a.A)
		out[addr] = max(out[addr], ttl)
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

func writeTCPMsg(w io.Writer, msg []byte) error {
	if len(msg) > 65535 {
		return errors.New("dns message too long")
	}
	buf := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(msg)), uint16(len(msg)))
	_, err := w.Write(append(buf, msg...))
	return err
}
