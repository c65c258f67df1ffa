package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/network"
)

// startServer serves h with limits on a loopback port.
func startServer(t *testing.T, h http.Handler, limits serverLimits) string {
	t.Helper()
	srv := newHTTPServer("127.0.0.1:0", h, limits)
	ln, err := listenHTTP(srv.Addr, limits)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closedByServer reports whether the server ends c (EOF or reset) before
// the client gives up after wait.
func closedByServer(c net.Conn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestHTTPServerResistsSlowClients: a client trickling its headers is cut
// off, one client cannot hold more than its share of connections, and
// long streams and slow uploads (E2B command output, file uploads) are
// not cut by any timeout.
func TestHTTPServerResistsSlowClients(t *testing.T) {
	t.Parallel()
	limits := serverLimits{readHeader: 300 * time.Millisecond, idle: time.Second, perClient: 3}
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 8 {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d %v", n, err)
	})
	addr := startServer(t, mux, limits)
	// No pooled connections: each subtest counts its own.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	t.Run("long streams and slow uploads go on", func(t *testing.T) {
		resp, err := client.Get("http://" + addr + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(body), "chunk") != 8 {
			t.Fatalf("a stream longer than the header timeout was cut: %q %v", body, err)
		}
		pr, pw := io.Pipe()
		go func() {
			for range 8 {
				pw.Write([]byte("0123456789"))
				time.Sleep(100 * time.Millisecond)
			}
			pw.Close()
		}()
		resp, err = client.Post("http://"+addr+"/upload", "application/octet-stream", pr)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "80 <nil>" {
			t.Fatalf("a slow upload got %q, want all 80 bytes", body)
		}
	})

	t.Run("slowloris headers are cut off", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		done := make(chan struct{})
		go func() { // one header byte every 100 ms, forever
			defer close(done)
			c.Write([]byte("GET /stream HTTP/1.1\r\nHost: x\r\n"))
			for range 30 {
				if _, err := c.Write([]byte("X")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		if !closedByServer(c, 2*time.Second) {
			t.Fatalf("a client sending its headers a byte at a time still holds the connection")
		}
		c.Close()
		<-done
	})

	t.Run("one client holds at most its share", func(t *testing.T) {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for range limits.perClient {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		// The server has accepted them once one of them gets an answer.
		if _, err := held[0].Write([]byte("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")); err != nil {
			t.Fatal(err)
		}
		held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(held[0]), nil)
		if err != nil {
			t.Fatalf("request on an admitted connection: %v", err)
		}
		resp.Body.Close()
		extra, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		if !closedByServer(extra, 2*time.Second) {
			t.Fatalf("connection %d of one client was kept open", limits.perClient+1)
		}
		// Closing one frees a place.
		held[1].Close()
		held = append(held[:1], held[2:]...)
		ok := false
		for range 50 {
			if r, err := client.Get("http://" + addr + "/upload"); err == nil {
				r.Body.Close()
				ok = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("no place freed after a connection closed")
		}
	})

}

func TestNetworkSecuritySettings(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	nc, err := networkConfig(cfg, nil, nil)
	if err != nil || nc.AlwaysDenied != nil || nc.DNSUpstream.IsValid() || nc.SocketMark != network.DefaultSocketMark {
		t.Fatalf("defaults: %+v %v; want the network package's defaults", nc, err)
	}
	cfg.Network.AlwaysDenied = []string{"10.0.0.0/8", "fd00::/8"}
	cfg.Network.DNSUpstream = "192.0.2.53"
	if nc, err = networkConfig(cfg, nil, nil); err != nil || len(nc.AlwaysDenied) != 2 ||
		nc.DNSUpstream != netip.MustParseAddrPort("192.0.2.53:53") {
		t.Fatalf("configured: %+v %v", nc, err)
	}
	cfg.Network.DNSUpstream = "192.0.2.53:5353"
	if nc, err = networkConfig(cfg, nil, nil); err != nil || nc.DNSUpstream.Port() != 5353 {
		t.Fatalf("upstream with port: %v %v", nc.DNSUpstream, err)
	}
	for _, bad := range []func(*config.Config){
		func(c *config.Config) { c.Network.AlwaysDenied = []string{"10.0.0.0/33"} },
		func(c *config.Config) { c.Network.DNSUpstream = "resolver.example" },
		func(c *config.Config) { c.Network.DNSUpstream = "[::1]:53" },
	} {
		c := config.Default()
		bad(&c)
		if _, err := networkConfig(c, nil, nil); err == nil {
			t.Errorf("accepted %+v", c.Network)
		}
	}
}
