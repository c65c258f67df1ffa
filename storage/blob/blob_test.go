package blob

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func content(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// rangeServer serves data with real range support on the loopback and counts requests.
func rangeServer(t *testing.T, data []byte) (*httptest.Server, *atomic.Int64) {
	var reqs atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs.Add(1)
		switch r.URL.Path {
		case "/blob":
			http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(data))
		case "/norange":
			w.Write(data)
		case "/auth":
			if r.Header.Get("Authorization") != "Bearer t0ken" {
				http.Error(w, "no", http.StatusUnauthorized)
				return
			}
			http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(data))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &reqs
}

func TestFile(t *testing.T) {
	t.Parallel()
	data := content(10000)
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, data, 0o644)
	b, err := Open(context.Background(), p, HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]byte, 100)
	if _, err := b.ReadAt(got, 5000); err != nil || !bytes.Equal(got, data[5000:5100]) || b.Size() != 10000 {
		t.Fatalf("file read: %v", err)
	}
	if _, err := Open(context.Background(), filepath.Join(t.TempDir(), "missing"), HTTPOptions{}); err == nil {
		t.Fatal("opened a missing file")
	}
}

func TestHTTPAndCache(t *testing.T) {
	t.Parallel()
	data := content(3<<20 + 123)
	srv, reqs := rangeServer(t, data)
	ctx := context.Background()
	h, err := OpenHTTP(ctx, srv.URL+"/blob", HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Size() != int64(len(data)) {
		t.Fatalf("size %d", h.Size())
	}
	c := NewCache(h, CacheOptions{BlockSize: 64 << 10, Capacity: 1 << 20, ReadAhead: 8})
	// Sequential 4 KiB reads: read-ahead turns 768 reads into few requests.
	before := reqs.Load()
	buf := make([]byte, 4096)
	for off := int64(0); off < 3<<20; off += 4096 {
		if _, err := c.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, data[off:off+4096]) {
			t.Fatalf("cached read at %d differs", off)
		}
	}
	if n := reqs.Load() - before; n > 10 {
		t.Fatalf("sequential read of 3 MiB took %d requests; read-ahead is not working", n)
	}
	// The tail past the last full block, and EOF.
	tail := make([]byte, 200)
	n, err := c.ReadAt(tail, int64(len(data)-123))
	if n != 123 || err != io.EOF || !bytes.Equal(tail[:n], data[len(data)-123:]) {
		t.Fatalf("tail read n=%d err=%v", n, err)
	}
	// Random concurrent reads agree with the data (capacity forces evictions).
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			p := make([]byte, 10000)
			for range 200 {
				off := r.Int64N(int64(len(data) - len(p)))
				if _, err := c.ReadAt(p, off); err != nil || !bytes.Equal(p, data[off:off+int64(len(p))]) {
					t.Errorf("concurrent read at %d: %v", off, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	hits, misses, fetches := c.Stats()
	if hits == 0 || misses == 0 || fetches > misses {
		t.Fatalf("stats hits=%d misses=%d fetches=%d", hits, misses, fetches)
	}
}

func TestHTTPErrors(t *testing.T) {
	t.Parallel()
	srv, _ := rangeServer(t, content(1000))
	ctx := context.Background()
	for path, want := range map[string]string{"/norange": "range", "/missing": "404", "/auth": "401"} {
		_, err := OpenHTTP(ctx, srv.URL+path, HTTPOptions{Retries: 1})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), srv.URL+path) {
			t.Errorf("%s: error %v, want one naming the URL and %q", path, err, want)
		}
	}
	h, err := OpenHTTP(ctx, srv.URL+"/auth", HTTPOptions{Header: http.Header{"Authorization": {"Bearer t0ken"}}})
	if err != nil || h.Size() != 1000 {
		t.Fatalf("with a token: %v", err)
	}
}

func TestTotalSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"bytes 0-0/1234": 1234, "bytes 5-9/10": 10} {
		if got, err := totalSize(in); err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "bytes 0-0/*", "items 0-0/5", "bytes 0-0/-3"} {
		if _, err := totalSize(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestMapped(t *testing.T) {
	t.Parallel()
	data := content(64 << 10)
	p := filepath.Join(t.TempDir(), "m")
	os.WriteFile(p, data, 0o644)
	m, err := OpenMapped(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := make([]byte, 5000)
	if n, err := m.ReadAt(got, 1000); n != 5000 || err != nil || !bytes.Equal(got, data[1000:6000]) {
		t.Fatalf("mapped read n=%d err=%v", n, err)
	}
	if n, err := m.ReadAt(got, int64(len(data)-10)); n != 10 || err != io.EOF {
		t.Fatalf("read at the end n=%d err=%v", n, err)
	}
	// A file truncated under its mapping faults on access: an error, not a crash.
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadAt(got, 32<<10); err == nil || !strings.Contains(err.Error(), "changed underneath") {
		t.Fatalf("read of a truncated mapping: %v", err)
	}
	if _, err := OpenMapped(p); err == nil {
		t.Fatal("mapped an empty file")
	}
	if b, err := OpenLocal(p, true); err != nil || b.Size() != 0 {
		t.Fatalf("OpenLocal of an empty file should fall back to pread: %v", err)
	}
}

// TestRegistryTokenFlow: a registry that answers 401 with a Bearer challenge
// is read after an anonymous token request to its realm.
func TestRegistryTokenFlow(t *testing.T) {
	t.Parallel()
	data := content(5000)
	var tokens atomic.Int64
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/token":
			if r.URL.Query().Get("scope") != "repository:a/b:pull,push" || r.URL.Query().Get("service") != "reg" {
				http.Error(w, "bad scope", http.StatusBadRequest)
				return
			}
			tokens.Add(1)
			w.Write([]byte(`{"token":"s3cret"}`))
		case "/v2/a/b/blobs/sha256:00":
			if r.Header.Get("Authorization") != "Bearer s3cret" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="`+srv.URL+`/token",service="reg",scope="repository:a/b:pull,push"`)
				http.Error(w, "auth", http.StatusUnauthorized)
				return
			}
			http.ServeContent(w, r, "b", time.Time{}, bytes.NewReader(data))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	h, err := OpenHTTP(context.Background(), srv.URL+"/v2/a/b/blobs/sha256:00", HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1000)
	for _, off := range []int64{0, 4000} {
		if _, err := h.ReadAt(got, off); err != nil || !bytes.Equal(got, data[off:off+1000]) {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	if tokens.Load() != 1 {
		t.Fatalf("%d token requests, want 1 (the token is reused)", tokens.Load())
	}
	if p, ok := parseBearer(`Basic realm="x"`); ok {
		t.Fatalf("parsed a Basic challenge as Bearer: %v", p)
	}
}

// lyingServer answers range requests with 206 and the bytes of data, but
// with what lie does to the Content-Range and the offset served.
func lyingServer(t *testing.T, data []byte, lie func(first, last int64) (cr string, from int64)) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var first, last int64
		if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &first, &last); err != nil {
			http.Error(w, "bad range", http.StatusBadRequest)
			return
		}
		cr, from := fmt.Sprintf("bytes %d-%d/%d", first, last, len(data)), first
		if first > 0 { // the probe of OpenHTTP is answered truthfully
			cr, from = lie(first, last)
		}
		if cr != "" {
			w.Header().Set("Content-Range", cr)
		}
		w.WriteHeader(http.StatusPartialContent)
		w.Write(data[from:min(int64(len(data)), from+last-first+1)])
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestReadAtChecksContentRange: a 206 answer is used only if its
// Content-Range is the range asked for, of a blob of the size it had when
// opened; anything else is an error, never bytes of another offset.
func TestReadAtChecksContentRange(t *testing.T) {
	t.Parallel()
	data := content(1000)
	ctx := context.Background()
	for name, lie := range map[string]func(first, last int64) (string, int64){
		"other offset": func(first, last int64) (string, int64) {
			return fmt.Sprintf("bytes 0-%d/1000", last-first), 0
		},
		"shorter": func(first, last int64) (string, int64) {
			return fmt.Sprintf("bytes %d-%d/1000", first, first+(last-first)/2), first
		},
		"other total":   func(first, last int64) (string, int64) { return fmt.Sprintf("bytes %d-%d/2000", first, last), first },
		"unknown total": func(first, last int64) (string, int64) { return fmt.Sprintf("bytes %d-%d/*", first, last), first },
		"missing":       func(first, last int64) (string, int64) { return "", first },
		"signed":        func(first, last int64) (string, int64) { return fmt.Sprintf("bytes +%d-%d/1000", first, last), first },
		"past the end":  func(first, last int64) (string, int64) { return fmt.Sprintf("bytes %d-1000/1000", first), first },
	} {
		srv := lyingServer(t, data, lie)
		h, err := OpenHTTP(ctx, srv.URL, HTTPOptions{Retries: 1})
		if err != nil {
			t.Fatalf("%s: open: %v", name, err)
		}
		p := make([]byte, 100)
		if n, err := h.ReadAt(p, 500); err == nil || !strings.Contains(err.Error(), "Content-Range") {
			t.Errorf("%s: ReadAt = %d, %v; want a Content-Range error", name, n, err)
		}
	}
	// The truthful server still works.
	srv := lyingServer(t, data, func(first, last int64) (string, int64) {
		return fmt.Sprintf("bytes %d-%d/1000", first, last), first
	})
	h, err := OpenHTTP(ctx, srv.URL, HTTPOptions{Retries: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 100)
	if n, err := h.ReadAt(p, 500); err != nil || n != 100 || !bytes.Equal(p, data[500:600]) {
		t.Errorf("truthful server: %d, %v", n, err)
	}
}
