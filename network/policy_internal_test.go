package network

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestParseEntry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		domains bool
		lo, hi  string
		domain  string
		wild    bool
		wantErr bool
	}{
		{in: "192.0.2.0/24", lo: "192.0.2.0", hi: "192.0.2.255"},
		{in: "192.0.2.77/24", lo: "192.0.2.0", hi: "192.0.2.255"},
		{in: " 8.8.8.8 ", lo: "8.8.8.8", hi: "8.8.8.8"},
		{in: "0.0.0.0/0", lo: "0.0.0.0", hi: "255.255.255.255"},
		{in: "Example.COM.", domains: true, domain: "example.com"},
		{in: "*.example.com", domains: true, domain: "example.com", wild: true},
		{in: "example.com", wantErr: true}, // no domains in denyOut
		{in: "2001:db8::/32", wantErr: true},
		{in: "::1", domains: true, wantErr: true},
		{in: "10.0.0.0/33", wantErr: true},
		{in: "*", domains: true, wantErr: true},
		{in: "a..b", domains: true, wantErr: true},
		{in: "exa mple.com", domains: true, wantErr: true},
		{in: "", domains: true, wantErr: true},
	}
	for _, c := range cases {
		r, d, err := parseEntry(c.in, c.domains)
		if (err != nil) != c.wantErr {
			t.Errorf("parseEntry(%q) err = %v, wantErr %v", c.in, err, c.wantErr)
			continue
		}
		switch {
		case err != nil:
		case c.domain != "":
			if d == nil || d.name != c.domain || d.wildcard != c.wild {
				t.Errorf("parseEntry(%q) = %+v, want domain %q wildcard %v", c.in, d, c.domain, c.wild)
			}
		default:
			lo, hi := netip.MustParseAddr(c.lo), netip.MustParseAddr(c.hi)
			if d != nil || !r.contains(lo) || !r.contains(hi) || r != (ipRange{r.lo, r.hi}) {
				t.Errorf("parseEntry(%q) = %+v", c.in, r)
			}
			if prefixRange(netip.PrefixFrom(lo, 32)).lo != r.lo || prefixRange(netip.PrefixFrom(hi, 32)).lo != r.hi {
				t.Errorf("parseEntry(%q) = [%d,%d], want [%s,%s]", c.in, r.lo, r.hi, lo, hi)
			}
		}
	}
}

func TestDomainMatch(t *testing.T) {
	t.Parallel()
	exact, _ := parseDomainPattern("example.com")
	wild, _ := parseDomainPattern("*.example.com")
	cases := []struct {
		p    domainPattern
		q    string
		want bool
	}{
		{exact, "example.com.", true},
		{exact, "EXAMPLE.com", true},
		{exact, "www.example.com", false},
		{exact, "badexample.com", false},
		{wild, "www.example.com.", true},
		{wild, "a.b.example.com", true},
		{wild, "example.com", false},
		{wild, "badexample.com", false},
		{wild, ".example.com", false},
	}
	for _, c := range cases {
		if got := c.p.match(c.q); got != c.want {
			t.Errorf("%+v.match(%q) = %v, want %v", c.p, c.q, got, c.want)
		}
	}
}

func TestMergeRanges(t *testing.T) {
	t.Parallel()
	r := func(lo, hi uint32) ipRange { return ipRange{lo, hi} }
	cases := []struct{ in, want []ipRange }{
		{nil, nil},
		{[]ipRange{r(5, 9), r(1, 3)}, []ipRange{r(1, 3), r(5, 9)}},
		{[]ipRange{r(1, 5), r(3, 9)}, []ipRange{r(1, 9)}},
		{[]ipRange{r(1, 4), r(5, 9)}, []ipRange{r(1, 9)}}, // adjacent
		{[]ipRange{r(1, 9), r(2, 3)}, []ipRange{r(1, 9)}},
		{[]ipRange{r(0, ^uint32(0)), r(7, 7)}, []ipRange{r(0, ^uint32(0))}},
	}
	for _, c := range cases {
		if got := mergeRanges(c.in); !slices.Equal(got, c.want) {
			t.Errorf("mergeRanges(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	els := rangeElements([]ipRange{r(10, 20), r(100, ^uint32(0))})
	if len(els) != 3 || !els[1].IntervalEnd || els[2].IntervalEnd {
		t.Fatalf("rangeElements: %+v, want start, end, open start", els)
	}
}

func TestAnswerAddrsClampsTTL(t *testing.T) {
	t.Parallel()
	name := dnsmessage.MustNewName("x.test.")
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1, Response: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	b.StartAnswers()
	rh := func(ttl uint32) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: name, Class: dnsmessage.ClassINET, TTL: ttl}
	}
	b.CNAMEResource(rh(5), dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("y.test.")})
	b.AResource(rh(1), dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}})
	b.AResource(rh(1<<30), dnsmessage.AResource{A: [4]byte{192, 0, 2, 2}})
	resp, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	got := answerAddrs(resp, nil)
	want := map[netip.Addr]time.Duration{
		netip.MustParseAddr("192.0.2.1"): dnsMinTTL,
		netip.MustParseAddr("192.0.2.2"): dnsMaxTTL,
	}
	if len(got) != len(want) || got[netip.MustParseAddr("192.0.2.1")] != dnsMinTTL || got[netip.MustParseAddr("192.0.2.2")] != dnsMaxTTL {
		t.Fatalf("answerAddrs = %v, want %v", got, want)
	}
	if _, q, _, ok := parseQuery(resp); ok {
		t.Fatalf("a response was taken for a query (%q)", q.Name)
	}
	if got := answerAddrs(resp, prefixesToRanges(DefaultAlwaysDenied)); len(got) != 0 {
		t.Fatalf("answerAddrs kept always-denied addresses: %v", got)
	}
}

func FuzzPolicyEntry(f *testing.F) {
	for _, s := range []string{"192.0.2.0/24", "1.2.3.4", "*.example.com", "example.com.", "::1", "a..b", "0.0.0.0/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, d, err := parseEntry(s, true)
		if err != nil {
			return
		}
		if d != nil {
			if checkDomainName(d.name) != nil {
				t.Fatalf("accepted invalid domain %q from %q", d.name, s)
			}
			d.match(s)
			return
		}
		if r.lo > r.hi {
			t.Fatalf("range %+v from %q", r, s)
		}
		if len(rangeElements(mergeRanges([]ipRange{r, r}))) == 0 {
			t.Fatalf("no elements for %q", s)
		}
	})
}

func FuzzDNSMessage(f *testing.F) {
	name := dnsmessage.MustNewName("example.com.")
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	f.Add(q)
	f.Add([]byte{})
	f.Add(make([]byte, 12))
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, question, _, ok := parseQuery(msg)
		if ok {
			qname := question.Name.String()
			p, _ := parseDomainPattern(qname)
			p.match(qname)
			if r := errorReply(h, question, dnsmessage.RCodeRefused); r != nil {
				if _, _, _, ok := parseQuery(r); ok {
					t.Fatalf("error reply parses as a query")
				}
				if !answers(r, h.ID, question) {
					t.Fatalf("error reply does not answer its query")
				}
			}
			for _, size := range []int{0, 4096} {
				if uq, err := upstreamQuery(h, question, size); err == nil {
					if _, q2, _, ok := parseQuery(uq); !ok || q2 != question {
						t.Fatalf("upstream query does not carry the question %v", question)
					}
				}
			}
		}
		for a, ttl := range answerAddrs(msg, nil) {
			if !a.Is4() || ttl < dnsMinTTL || ttl > dnsMaxTTL {
				t.Fatalf("answerAddrs gave %s for %s", ttl, a)
			}
		}
	})
}
