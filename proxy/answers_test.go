package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

// TestNotFoundAnswer checks the 502 body of E2B's proxy for sandboxes that
// are unknown, killed (no record) or not running, by host and by header.
func TestNotFoundAnswer(t *testing.T) {
	reg := &sandboxes{recs: map[string]record{"paused1": {Sandbox: Sandbox{Paused: true}}}}
	srv := httptest.NewServer(New(reg, "sbx.test", nil))
	defer srv.Close()
	for _, c := range []struct {
		name, host, id string
		hdr            map[string]string
	}{
		{"unknown by host", "8080-gone.sbx.test", "gone", nil},
		{"paused by host", "49983-paused1.sbx.test", "paused1", nil},
		{"unknown by header", "127.0.0.1", "gone", map[string]string{HeaderSandboxID: "gone", HeaderSandboxPort: "49983"}},
		{"an id that cannot be one", "127.0.0.1", "", map[string]string{HeaderSandboxID: "a.b.c", HeaderSandboxPort: "80"}},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/health", nil)
		req.Host = c.host
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: body: %v", c.name, err)
		}
		want := map[string]any{"sandboxId": c.id, "message": "The sandbox was not found", "code": float64(502)}
		if resp.StatusCode != http.StatusBadGateway || len(body) != len(want) ||
			body["sandboxId"] != want["sandboxId"] || body["message"] != want["message"] || body["code"] != want["code"] {
			t.Errorf("%s: status %d body %v, want 502 %v", c.name, resp.StatusCode, body, want)
		}
	}
}

// TestNoAutoResumeWithoutMemory: traffic to a paused autoResume sandbox
// resumes it, but not when it was paused without memory (a filesystem-only
// pause is resumed by an explicit call only).
func TestNoAutoResumeWithoutMemory(t *testing.T) {
	reg := &sandboxes{connects: map[string]int{}, recs: map[string]record{
		"mem": {Sandbox: Sandbox{Paused: true, AutoResume: true}},
		"fs":  {Sandbox: Sandbox{Paused: true, AutoResume: true, FilesystemOnly: true}},
	}}
	srv := httptest.NewServer(New(reg, "sbx.test", nil))
	defer srv.Close()
	for _, id := range []string{"mem", "fs"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/health", nil)
		req.Host = "49983-" + id + ".sbx.test"
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if reg.connects["mem"] != 1 || reg.connects["fs"] != 0 {
		t.Fatalf("auto-resumes: %v, want one of the memory pause and none of the filesystem-only one", reg.connects)
	}
}

// TestMaskRequestHost checks that a sandbox created with maskRequestHost
// sees the mask (with ${PORT} replaced) as the Host of proxied requests,
// and that one without sees the client's.
func TestMaskRequestHost(t *testing.T) {
	s := guestSlots(t, 1)[0]
	l := nettest.Listen(t, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, 8080))
	guest := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Host))
	})}
	go guest.Serve(l)
	t.Cleanup(func() { guest.Close() })
	reg := &sandboxes{
		recs: map[string]record{
			"masked": {running: true, Sandbox: Sandbox{MaskRequestHost: "localhost:${PORT}"}},
			"plain":  {running: true},
		},
		slots: map[string]*network.Slot{"masked": s, "plain": s},
	}
	srv := httptest.NewServer(New(reg, "sbx.test", nil))
	defer srv.Close()
	for host, want := range map[string]string{"8080-masked.sbx.test": "localhost:8080", "8080-plain.sbx.test": "8080-plain.sbx.test"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Host = host
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got [256]byte
		n, _ := resp.Body.Read(got[:])
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(got[:n]) != want {
			t.Errorf("%s: status %d, guest saw Host %q, want %q", host, resp.StatusCode, got[:n], want)
		}
	}
}

// TestKillEndsStreams: a killed sandbox's open streams end at once (a
// stopped VM never closes them itself), and only that sandbox's.
func TestKillEndsStreams(t *testing.T) {
	s := guestSlots(t, 1)[0]
	release := make(chan struct{})
	l := nettest.Listen(t, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, 8080))
	guest := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("started\n"))
		w.(http.Flusher).Flush()
		<-release // a VM that stopped: the stream neither ends nor fails
	})}
	go guest.Serve(l)
	t.Cleanup(func() { close(release); guest.Close() })
	reg := &sandboxes{
		recs:  map[string]record{"a": {running: true}, "b": {running: true}},
		slots: map[string]*network.Slot{"a": s, "b": s},
	}
	p := New(reg, "sbx.test", nil)
	srv := httptest.NewServer(p)
	defer srv.Close()
	open := func(id string) (*http.Response, chan error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/stream", nil)
		req.Host = "8080-" + id + ".sbx.test"
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, len("started\n"))
		if _, err := io.ReadFull(resp.Body, line); err != nil || string(line) != "started\n" {
			t.Fatalf("stream of %s: %q %v", id, line, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, resp.Body)
			done <- err
		}()
		return resp, done
	}
	respA, doneA := open("a")
	defer respA.Body.Close()
	respB, doneB := open("b")
	defer respB.Body.Close()

	p.Ended("a", "killed")
	select {
	case err := <-doneA:
		if err == nil {
			t.Error("the killed sandbox's stream ended as if complete; want an error")
		}
	case <-time.After(30 * time.Second): // a guard against a hang, not a measurement
		t.Fatal("the killed sandbox's stream is still open")
	}
	if n := p.conns.open("a"); n != 0 {
		t.Errorf("%d upstream connections to the killed sandbox are still open", n)
	}
	select {
	case err := <-doneB:
		t.Fatalf("another sandbox's stream ended too: %v", err)
	default:
	}
	if p.conns.open("b") != 1 {
		t.Errorf("sandbox b: %d upstream connections, want its one stream", p.conns.open("b"))
	}
}

// TestStreamWhileRequestBodyOpen: a guest that answers before it has read
// the whole request body (a Connect stream does) gets every byte the client
// sends after the answer began, and the client gets the whole answer.
// Without full duplex, net/http's server would drain the request body under
// the transport that forwards it, and the transport would close the
// upstream connection mid-answer ("use of closed network connection").
func TestStreamWhileRequestBodyOpen(t *testing.T) {
	s := guestSlots(t, 1)[0]
	answered := make(chan chan struct{}, 1) // the next exchange's "guest answered" signal
	l := nettest.Listen(t, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, 8080))
	guest := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		first := make([]byte, len("first;"))
		_, err := io.ReadFull(r.Body, first)
		_, _ = w.Write([]byte("started\n"))
		w.(http.Flusher).Flush()
		close(<-answered)
		rest, rerr := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %q err %v\n", append(first, rest...), errors.Join(err, rerr))
	})}
	go guest.Serve(l)
	t.Cleanup(func() { guest.Close() })
	reg := &sandboxes{
		recs:  map[string]record{"a": {running: true}},
		slots: map[string]*network.Slot{"a": s},
	}
	srv := httptest.NewServer(New(reg, "sbx.test", nil))
	defer srv.Close()
	// The cut was a race inside net/http that one exchange in ten or twenty
	// lost: many exchanges make a pass on the old code vanishingly unlikely.
	for i := range 200 {
		done := make(chan struct{})
		answered <- done
		if err := exchange(srv.URL, done); err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
	}
}

// exchange sends a request whose body ends only after the guest answered
// (done), and checks the answer and what the guest saw.
func exchange(url string, done <-chan struct{}) error {
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("first;"))
		select {
		case <-done:
			_, _ = pw.Write([]byte("second"))
		case <-time.After(30 * time.Second): // a guard against a hang
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, url+"/stream", pr)
	req.Host = "8080-a.sbx.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	all, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("the answer was cut short after %q: %w", all, err)
	}
	if want := "started\ngot \"first;second\" err <nil>\n"; string(all) != want {
		return fmt.Errorf("answer %q, want %q", all, want)
	}
	return nil
}

// TestAcceptEncodingAsSent: the guest sees the client's Accept-Encoding as
// the client sent it, and none when the client sent none (the proxy's
// transport must not ask for gzip behind the client's back).
func TestAcceptEncodingAsSent(t *testing.T) {
	s := guestSlots(t, 1)[0]
	var hits atomic.Int32
	guestServer(t, s, &hits)
	reg := &sandboxes{
		recs:  map[string]record{"a": {running: true}},
		slots: map[string]*network.Slot{"a": s},
	}
	srv := httptest.NewServer(New(reg, "sbx.test", nil))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	for _, sent := range []string{"", "br"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Host = "8080-a.sbx.test"
		if sent != "" {
			req.Header.Set("Accept-Encoding", sent)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var seen http.Header
		err = json.NewDecoder(resp.Body).Decode(&seen)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := seen.Get("Accept-Encoding"); got != sent {
			t.Errorf("client sent Accept-Encoding %q, the guest saw %q", sent, got)
		}
	}
}
