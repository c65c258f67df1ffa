package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
)

// guestServer answers on port 8000: GET /stream sends five chunked lines
// 0.3 s apart; GET /ws upgrades to a WebSocket and echoes one text frame.
const guestServer = `import base64, hashlib, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc)
            self.end_headers()
            hdr = self.rfile.read(2)
            n = hdr[1] & 0x7f
            mask = self.rfile.read(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(n)))
            self.wfile.write(bytes([0x81, len(data)]) + data)
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(5):
            line = ("tick %d\n" % i).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            time.sleep(0.3)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// headerTransport adds the proxy's routing headers to every request.
type headerTransport struct{ id, port string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", h.port)
	return http.DefaultTransport.RoundTrip(r)
}

// TestProxyStreamingAndWebSocket: a chunked response arrives through the
// proxy as the guest writes it, and a WebSocket upgrade passes through.
func TestProxyStreamingAndWebSocket(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	n.writeFile(t, id, "/home/user/srv.py", guestServer)
	agent := &http.Client{Transport: headerTransport{id, "49983"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, stderr, code, err := agentclient.Run(ctx, n.proxy, agent, "/bin/bash", "-c",
		"setsid nohup python3 /home/user/srv.py >/tmp/srv.log 2>&1 < /dev/null & disown")
	if err != nil || code != 0 {
		t.Fatalf("start the guest server through the proxy: %d %v %s", code, err, stderr)
	}
	user := &http.Client{Transport: headerTransport{id, "8000"}}
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		req, _ := http.NewRequestWithContext(ctx, "GET", n.proxy+"/stream", nil)
		resp, err = user.Do(req)
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest server on port 8000 not reachable through the proxy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	start := time.Now()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	firstAt := time.Since(start)
	if err != nil || first != "tick 0\n" {
		t.Fatalf("first streamed line: %q %v", first, err)
	}
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	total := time.Since(start)
	if err != nil || strings.Count(string(rest), "tick") != 4 {
		t.Fatalf("rest of the stream: %q %v", rest, err)
	}
	if total-firstAt < 800*time.Millisecond {
		t.Fatalf("the proxy buffered the stream: first line after %s, end after %s", firstAt, total)
	}

	// WebSocket: a raw upgrade through the dedicated proxy port.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(n.proxy, "http://"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: sandbox\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"+
		"E2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 8000\r\n\r\n", id)
	cr := bufio.NewReader(conn)
	wsResp, err := http.ReadResponse(cr, nil)
	if err != nil || wsResp.StatusCode != http.StatusSwitchingProtocols ||
		wsResp.Header.Get("Sec-Websocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("websocket upgrade through the proxy: %v %+v", err, wsResp)
	}
	msg := []byte("hello through the proxy")
	mask := make([]byte, 4)
	_, _ = rand.Read(mask)
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
	for i, c := range msg {
		frame = append(frame, c^mask[i%4])
	}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(cr, hdr); err != nil {
		t.Fatalf("read echoed frame: %v", err)
	}
	echo := make([]byte, hdr[1]&0x7f)
	if _, err := io.ReadFull(cr, echo); err != nil || hdr[0] != 0x81 || string(echo) != string(msg) {
		t.Fatalf("echoed frame: %x %q %v", hdr, echo, err)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}
