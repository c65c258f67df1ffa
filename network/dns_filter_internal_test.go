package network

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// fakeUpstream is a real DNS server on loopback that answers A queries
// from a table and records every message it receives.
type fakeUpstream struct {
	addr    netip.AddrPort
	records map[string][]netip.Addr

	mu   sync.Mutex
	seen []seenQuery
}

type seenQuery struct {
	name        string
	typ         dnsmessage.Type
	additionals int // records other than EDNS OPT
}

func startUpstream(t *testing.T, records map[string][]netip.Addr) *fakeUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	u := &fakeUpstream{addr: pc.LocalAddr().(*net.UDPAddr).AddrPort(), records: records}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := u.answer(buf[:n]); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	return u
}

func (u *fakeUpstream) answer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	extra := 0
	p.SkipAllQuestions()
	p.SkipAllAnswers()
	p.SkipAllAuthorities()
	for {
		rh, err := p.AdditionalHeader()
		if err != nil {
			break
		}
		if rh.Type != dnsmessage.TypeOPT {
			extra++
		}
		p.SkipAdditional()
	}
	name := strings.TrimSuffix(strings.ToLower(question.Name.String()), ".")
	u.mu.Lock()
	u.seen = append(u.seen, seenQuery{name: name, typ: question.Type, additionals: extra})
	u.mu.Unlock()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired})
	b.StartQuestions()
	b.Question(question)
	b.StartAnswers()
	if question.Type == dnsmessage.TypeA {
		for _, a := range u.records[name] {
			b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 300},
				dnsmessage.AResource{A: a.As4()})
		}
	}
	out, _ := b.Finish()
	return out
}

func (u *fakeUpstream) saw(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, s := range u.seen {
		if s.name == name {
			return true
		}
	}
	return false
}

// query builds a DNS message; extra adds a TXT record to the additional
// section (data a guest might try to smuggle out).
func query(t *testing.T, name string, typ dnsmessage.Type, class dnsmessage.Class, op dnsmessage.OpCode, extra bool) []byte {
	t.Helper()
	n := dnsmessage.MustNewName(name)
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x1234, OpCode: op, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: n, Type: typ, Class: class}); err != nil {
		t.Fatal(err)
	}
	if extra {
		b.StartAdditionals()
		b.TXTResource(dnsmessage.ResourceHeader{Name: n, Class: dnsmessage.ClassINET},
			dnsmessage.TXTResource{TXT: []string{"secret data leaving the sandbox"}})
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func rcodeOf(t *testing.T, resp []byte) dnsmessage.RCode {
	t.Helper()
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		t.Fatalf("unparsable reply: %v", err)
	}
	if !h.Response || h.ID != 0x1234 {
		t.Fatalf("reply header %+v does not answer the query", h)
	}
	return h.RCode
}

// TestResolverUnderDenyAll drives the slot resolver's protocol logic
// against a real DNS server on loopback, under E2B's "deny all, allow
// these domains" policy and under an open one.
func TestResolverUnderDenyAll(t *testing.T) {
	t.Parallel()
	public, public2 := netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("93.184.215.15")
	up := startUpstream(t, map[string][]netip.Addr{
		"allowed.test": {netip.MustParseAddr("10.1.2.3"), public, netip.MustParseAddr("169.254.169.254")},
		"other.test":   {public2},
	})
	newR := func(p Policy) (*resolver, *map[netip.Addr]time.Duration) {
		cp, err := compilePolicy(p)
		if err != nil {
			t.Fatal(err)
		}
		var allowed map[netip.Addr]time.Duration
		var d net.Dialer
		return &resolver{
			policy: func() *compiledPolicy { return cp },
			allow: func(_ string, addrs map[netip.Addr]time.Duration) error {
				allowed = addrs
				return nil
			},
			dial: d.DialContext, upstream: up.addr, denied: prefixesToRanges(DefaultAlwaysDenied),
			log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}, &allowed
	}
	ctx := context.Background()
	denyAll := Policy{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}}

	cases := []struct {
		name      string
		policy    Policy
		q         []byte
		rcode     dnsmessage.RCode
		forwarded string // the name the upstream must have seen, "" for none
	}{
		{"a name no rule allows is refused", denyAll,
			query(t, "other.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"its subdomain too", denyAll,
			query(t, "x.allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"the same under DenyInternet", Policy{DenyInternet: true, AllowOut: []string{"allowed.test"}},
			query(t, "other.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"an allowed name is answered", denyAll,
			query(t, "Allowed.Test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeSuccess, "allowed.test"},
		{"NOTIFY is refused", denyAll,
			query(t, "allowed.test.", dnsmessage.TypeSOA, dnsmessage.ClassINET, 4, false), dnsmessage.RCodeRefused, ""},
		{"UPDATE is refused", denyAll,
			query(t, "allowed.test.", dnsmessage.TypeSOA, dnsmessage.ClassINET, 5, false), dnsmessage.RCodeRefused, ""},
		{"IQUERY is refused", denyAll,
			query(t, "allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 1, false), dnsmessage.RCodeRefused, ""},
		{"NULL records are refused", denyAll,
			query(t, "allowed.test.", dnsmessage.Type(10), dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"ANY is refused", denyAll,
			query(t, "allowed.test.", dnsmessage.TypeALL, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"zone transfers are refused", denyAll,
			query(t, "allowed.test.", dnsmessage.TypeAXFR, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeRefused, ""},
		{"class CHAOS is refused", Policy{},
			query(t, "version.bind.", dnsmessage.TypeTXT, dnsmessage.ClassCHAOS, 0, false), dnsmessage.RCodeRefused, ""},
		{"an open policy forwards any name", Policy{},
			query(t, "other.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, false), dnsmessage.RCodeSuccess, "other.test"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up.mu.Lock()
			up.seen = nil
			up.mu.Unlock()
			r, _ := newR(c.policy)
			resp := r.handle(ctx, "udp", c.q)
			if resp == nil {
				t.Fatalf("no reply")
			}
			if got := rcodeOf(t, resp); got != c.rcode {
				t.Errorf("rcode %v, want %v", got, c.rcode)
			}
			up.mu.Lock()
			seen := up.seen
			up.mu.Unlock()
			switch {
			case c.forwarded == "" && len(seen) > 0:
				t.Errorf("forwarded to the upstream: %+v", seen)
			case c.forwarded != "" && !up.saw(c.forwarded):
				t.Errorf("upstream did not see %s: %+v", c.forwarded, seen)
			}
		})
	}

	t.Run("answers into denied ranges add nothing; nothing but the question leaves", func(t *testing.T) {
		r, allowed := newR(denyAll)
		up.mu.Lock()
		up.seen = nil
		up.mu.Unlock()
		resp := r.handle(ctx, "udp", query(t, "allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET, 0, true))
		if rcodeOf(t, resp) != dnsmessage.RCodeSuccess {
			t.Fatalf("allowed name not answered")
		}
		if len(*allowed) != 1 || (*allowed)[public] == 0 {
			t.Errorf("allow set got %v, want only %s", *allowed, public)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		if len(up.seen) != 1 || up.seen[0].additionals != 0 {
			t.Errorf("upstream saw %+v, want one query without the guest's additional records", up.seen)
		}
	})
}
