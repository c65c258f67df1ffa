package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The slot's DNS-aware resolver. Domain rules need something that sees
// names; a resolver does, without putting a process in the data path of
// every connection. It listens at NameserverIP:53 inside the slot; the slot
// redirects every DNS packet of the guest to it. For each query it:
//
//   - answers only standard queries (opcode QUERY, one question, class IN,
//     a usual record type: dnsTypes) and REFUSED to anything else;
//   - when the policy is closed (no internet, or a deny list covering every
//     address: E2B's "deny all, allow these domains"), refuses names no
//     AllowOut domain covers, so DNS is not a tunnel out either;
//   - forwards a query it rebuilt from the question alone (nothing else of
//     the guest's message leaves), from the host namespace, to the node's
//     upstream, and checks the answer matches the question;
//   - before answering a name an AllowOut domain covers, adds the answer's
//     IPv4 addresses to the slot's dns_allow set for the record's TTL
//     (clamped), so the guest's connection that follows is accepted;
//     addresses in the always-denied ranges are never added (a name cannot
//     be made to point into the private network).
//
// Known limits: an address allowed for one name is allowed for every name
// it serves (shared CDN addresses); a guest that learned an address while
// it was allowed keeps established connections after the entry expires
// (a policy change, though, cuts them).

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

// dnsTypes are the record types a guest may ask for.
var dnsTypes = map[dnsmessage.Type]bool{
	dnsmessage.TypeA: true, dnsmessage.TypeAAAA: true, dnsmessage.TypeCNAME: true, dnsmessage.TypeNS: true,
	dnsmessage.TypeSOA: true, dnsmessage.TypePTR: true, dnsmessage.TypeMX: true, dnsmessage.TypeTXT: true,
	dnsmessage.TypeSRV: true,
	64:                 true, 65: true, 257: true, // SVCB, HTTPS, CAA
}

type resolver struct {
	s *Slot
	// What the resolver needs of its slot, as functions so that the
	// protocol logic is testable without a slot.
	policy   func() *compiledPolicy
	allow    func(name string, addrs map[netip.Addr]time.Duration) error
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	upstream netip.AddrPort
	denied   []ipRange
	log      *slog.Logger

	udp    *net.UDPConn
	tcp    *net.TCPListener
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu      sync.Mutex
	records map[netip.Addr]dnsRecord
}

func newResolver(s *Slot) *resolver {
	return &resolver{
		s: s, policy: s.currentPolicy, allow: s.allowResolved,
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return s.m.dialHost(ctx, network, addr, false)
		},
		upstream: s.m.cfg.DNSUpstream, denied: s.m.denied, log: s.m.log.With("slot", s.Name),
		sem: make(chan struct{}, dnsMaxInflight), records: map[netip.Addr]dnsRecord{},
	}
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
	h, question, udpSize, ok := parseQuery(q)
	if !ok {
		return nil
	}
	if h.OpCode != 0 || question.Class != dnsmessage.ClassINET || !dnsTypes[question.Type] {
		return errorReply(h, question, dnsmessage.RCodeRefused)
	}
	qname := question.Name.String()
	pol := r.policy()
	allowed := pol.allowsName(qname)
	if pol.closed() && !allowed {
		return errorReply(h, question, dnsmessage.RCodeRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	if network != "udp" {
		udpSize = 0
	}
	resp, err := r.exchange(ctx, network, h, question, udpSize)
	if err != nil {
		r.log.Debug("dns upstream", "name", qname, "err", err)
		return errorReply(h, question, dnsmessage.RCodeServerFailure)
	}
	if !allowed {
		return resp
	}
	if addrs := answerAddrs(resp, r.denied); len(addrs) > 0 {
		if err := r.allow(qname, addrs); err != nil {
			r.log.Warn("dns allow", "name", qname, "err", err)
			return errorReply(h, question, dnsmessage.RCodeServerFailure)
		}
	}
	return resp
}

// exchange sends a query rebuilt from h and question to the upstream
// (dialled from the host namespace) and returns its answer to it.
func (r *resolver) exchange(ctx context.Context, network string, h dnsmessage.Header, question dnsmessage.Question, udpSize int) ([]byte, error) {
	q, err := upstreamQuery(h, question, udpSize)
	if err != nil {
		return nil, err
	}
	c, err := r.dial(ctx, network, r.upstream.String())
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
	if !answers(resp, h.ID, question) {
		return nil, errors.New("upstream answer does not match the query")
	}
	return resp, nil
}

// dnsUDPSize is the EDNS payload size offered upstream over UDP: large
// answers without fragmentation (the DNS flag day value).
const dnsUDPSize = 1232

// upstreamQuery builds the query sent upstream: the guest's ID, RD and CD
// bits and its question, nothing else; an EDNS record offering udpSize
// (at most dnsUDPSize) when the guest offered one over UDP, so that no
// answer is larger than the guest can take.
func upstreamQuery(h dnsmessage.Header, question dnsmessage.Question, udpSize int) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, RecursionDesired: h.RecursionDesired, CheckingDisabled: h.CheckingDisabled})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(question); err != nil {
		return nil, err
	}
	if udpSize > 0 {
		if err := b.StartAdditionals(); err != nil {
			return nil, err
		}
		var opt dnsmessage.ResourceHeader
		if err := opt.SetEDNS0(min(max(udpSize, 512), dnsUDPSize), dnsmessage.RCodeSuccess, false); err != nil {
			return nil, err
		}
		if err := b.OPTResource(opt, dnsmessage.OPTResource{}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// answers reports whether resp is a response with id to question.
func answers(resp []byte, id uint16, question dnsmessage.Question) bool {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || !h.Response || h.ID != id {
		return false
	}
	got, err := p.Question()
	return err == nil && got.Type == question.Type && got.Class == question.Class &&
		strings.EqualFold(got.Name.String(), question.Name.String())
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

// parseQuery returns the header and single question of a query, and the
// UDP payload size its EDNS record offers (0 without one).
func parseQuery(q []byte) (h dnsmessage.Header, question dnsmessage.Question, udpSize int, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return h, question, 0, false
	}
	if question, err = p.Question(); err != nil {
		return h, question, 0, false
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return h, question, 0, false // exactly one question
	}
	if p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return h, question, 0, true
	}
	for {
		rh, err := p.AdditionalHeader()
		if err != nil {
			return h, question, 0, true
		}
		if rh.Type == dnsmessage.TypeOPT {
			return h, question, int(rh.Class), true
		}
		if p.SkipAdditional() != nil {
			return h, question, 0, true
		}
	}
}

// errorReply builds an empty answer with rcode to the query h, question.
func errorReply(h dnsmessage.Header, question dnsmessage.Question, rcode dnsmessage.RCode) []byte {
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

// answerAddrs returns the IPv4 addresses of a successful answer that are
// not in denied, with their TTLs clamped to [dnsMinTTL, dnsMaxTTL].
func answerAddrs(resp []byte, denied []ipRange) map[netip.Addr]time.Duration {
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
		if slices.ContainsFunc(denied, func(r ipRange) bool { return r.contains(addr) }) {
			continue
		}
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
