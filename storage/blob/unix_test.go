package blob

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serveUnix serves data with range support on a Unix socket at sock.
func serveUnix(t *testing.T, sock string, data []byte) *http.Server {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/lazy/sha256/") {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv
}

const someHex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestUnixURL reads a blob through a Unix socket, named by a http+unix URL
// that keeps the digest in its path.
func TestUnixURL(t *testing.T) {
	t.Parallel()
	data := content(1 << 20)
	sock := filepath.Join(t.TempDir(), "layers.sock")
	serveUnix(t, sock, data)
	ref := UnixURL(sock, "/v1/lazy/sha256/"+someHex+"?size=1048576")
	if !IsURL(ref) {
		t.Fatalf("IsURL(%q) = false", ref)
	}
	b, err := Open(context.Background(), ref, HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Size() != int64(len(data)) || b.Name() != ref {
		t.Fatalf("size %d name %q", b.Size(), b.Name())
	}
	got := make([]byte, 300000)
	if _, err := b.ReadAt(got, 123457); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[123457:123457+300000]) {
		t.Fatal("bytes through the socket differ")
	}
	if d, ok := URLDigest(ref); !ok || d != "sha256:"+someHex {
		t.Fatalf("URLDigest = %q %v", d, ok)
	}
}

// TestUnixURLWaitsForTheServer: a read that starts while the server is
// down (a node server restarting) is answered once it is back, not failed.
func TestUnixURLWaitsForTheServer(t *testing.T) {
	t.Parallel()
	data := content(64 << 10)
	sock := filepath.Join(t.TempDir(), "layers.sock")
	srv := serveUnix(t, sock, data)
	h, err := openUnix(context.Background(), UnixURL(sock, "/v1/lazy/sha256/"+someHex), HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	back := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		serveUnix(t, sock, data)
		close(back)
	}()
	got := make([]byte, 4096)
	_, err = h.ReadAt(got, 8192)
	<-back
	if err != nil || !bytes.Equal(got, data[8192:8192+4096]) {
		t.Fatalf("read across the server's restart: %v", err)
	}
}

func TestParseUnixURL(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"http+unix://relative.sock:/x", "http+unix:///a/../b.sock:/x", "http+unix:///a.sock", "http+unix:///a.sock:x",
		"http://host/x", "http+unix:///a.sock:/x y",
	} {
		if s, u, err := ParseUnixURL(bad); err == nil {
			t.Errorf("ParseUnixURL(%q) = %q %q, want an error", bad, s, u)
		}
	}
	s, u, err := ParseUnixURL("http+unix:///run/a.sock:/v1/x?y=1")
	if err != nil || s != "/run/a.sock" || u != "/v1/x?y=1" {
		t.Fatalf("got %q %q %v", s, u, err)
	}
}

func TestURLDigest(t *testing.T) {
	t.Parallel()
	for ref, want := range map[string]string{
		"https://r.example/v2/a/b/blobs/sha256:" + someHex:        "sha256:" + someHex,
		"http://10.0.0.2:3002/v1/blobs/sha256/" + someHex:         "sha256:" + someHex,
		"https://r.example/v2/a/b/blobs/sha256:" + someHex[:63]:   "",
		"http://h/v1/blobs/sha256/" + strings.ToUpper(someHex):    "",
		"http://h/v1/blobs/sha512/" + someHex:                     "",
		"http+unix:///s.sock:/v1/lazy/sha256/" + someHex + "?x=1": "sha256:" + someHex,
		"http://h/plain.lsmt":                                     "",
	} {
		got, ok := URLDigest(ref)
		if got != want || ok != (want != "") {
			t.Errorf("URLDigest(%q) = %q %v, want %q", ref, got, ok, want)
		}
	}
}

func FuzzURLDigest(f *testing.F) {
	f.Add("http+unix:///s.sock:/v1/lazy/sha256/" + someHex)
	f.Add("https://r/v2/x/blobs/sha256:" + someHex)
	f.Fuzz(func(t *testing.T, ref string) {
		d, ok := URLDigest(ref)
		if ok && (len(d) != 71 || !isHexDigest(d[7:])) {
			t.Fatalf("URLDigest(%q) = %q", ref, d)
		}
		ParseUnixURL(ref)
	})
}

// TestUnixURLReadAheadOff: a blob opened with ReadAhead 1 fetches only the
// blocks its reads cover, even when they run on in sequence; by default
// the cache reads ahead on a sequential miss.
func TestUnixURLReadAheadOff(t *testing.T) {
	t.Parallel()
	data := content(8 << 20)
	for _, tc := range []struct {
		readAhead int
		more      bool // fetched more than read
	}{{1, false}, {0, true}} {
		sock := filepath.Join(t.TempDir(), "layers.sock")
		var served atomic.Int64
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cw := &countingWriter{ResponseWriter: w, n: &served}
			http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(data))
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		b, err := Open(context.Background(), UnixURL(sock, "/v1/lazy/sha256/"+someHex+"?size=8388608"), HTTPOptions{ReadAhead: tc.readAhead})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256<<10)
		for off := int64(0); off < 1<<20; off += int64(len(buf)) {
			if _, err := b.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+int64(len(buf))]) {
				t.Fatalf("read at %d: %v", off, err)
			}
		}
		b.Close()
		if got := served.Load(); (got > 1<<20+4096) != tc.more { // Open may probe a byte
			t.Errorf("read ahead %d: the server sent %d bytes for 1 MiB of sequential reads", tc.readAhead, got)
		}
	}
}

// countingWriter counts the body bytes written.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return w.ResponseWriter.Write(p)
}
