package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// logBuffer collects a logger's lines for the tests to wait on.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the log holds s (the test's own deadline bounds it).
func (b *logBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	for !strings.Contains(b.String(), s) {
		if t.Context().Err() != nil {
			t.Fatalf("the log never said %q:\n%s", s, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	waitLine   = "lazy reads wait for the server"
	resumeLine = "lazy reads resume"
)

// layerServer is a stand-in for aenvd's layer socket: range reads of data,
// one answer cut off halfway with the server's death when cut is set, 422
// for every read when corrupt is set. Like a killed process it leaves its
// socket file behind (connections are refused); the next one removes it.
type layerServer struct {
	sock    string
	data    []byte
	cut     atomic.Bool
	corrupt atomic.Bool
	reads   atomic.Int64
	ln      net.Listener
	srv     *http.Server
	died    chan struct{}
}

func (s *layerServer) start(t *testing.T) {
	t.Helper()
	if err := os.Remove(s.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	s.ln, s.died = ln, make(chan struct{})
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve)}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
}

func (s *layerServer) serve(w http.ResponseWriter, r *http.Request) {
	s.reads.Add(1)
	var off, last int64
	if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &off, &last); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case s.corrupt.Load() && last > 0:
		http.Error(w, "no source verifies the chunk", http.StatusUnprocessableEntity)
	case s.cut.Load() && last > 0:
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		n := last - off + 1
		fmt.Fprintf(bw, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n", off, last, len(s.data), n)
		bw.Write(s.data[off : off+n/2])
		bw.Flush()
		s.die()
		conn.Close()
	default:
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, last, len(s.data)))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(s.data[off : last+1])
	}
}

// die stops listening (its socket file stays) and drops the connections.
func (s *layerServer) die() {
	s.ln.Close()
	go s.srv.Close()
	close(s.died)
}

func newLayerServer(t *testing.T, n int) *layerServer {
	s := &layerServer{sock: filepath.Join(t.TempDir(), "layers.sock"), data: content(n)}
	s.start(t)
	return s
}

func (s *layerServer) open(ctx context.Context, t *testing.T, wait time.Duration, log *logBuffer) *unixBlob {
	t.Helper()
	u, err := openUnix(ctx, UnixURL(s.sock, "/v1/lazy/sha256/"+someHex), HTTPOptions{
		ServerWait: wait, Log: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// TestUnixReadWaitsAcrossRestart: the server dies halfway through an
// answer and a fresh one listens on the same path later; the read waits
// for it and returns the right bytes, and the log says once that reads
// wait and once that they resume.
func TestUnixReadWaitsAcrossRestart(t *testing.T) {
	t.Parallel()
	s := newLayerServer(t, 256<<10)
	log := &logBuffer{}
	u := s.open(t.Context(), t, time.Hour, log)
	s.cut.Store(true)
	got := make([]byte, 64<<10)
	done := make(chan error, 1)
	go func() {
		_, err := u.ReadAt(got, 4096)
		done <- err
	}()
	<-s.died
	log.waitFor(t, waitLine)
	select {
	case err := <-done:
		t.Fatalf("the read ended while the server was away: %v", err)
	default:
	}
	s.cut.Store(false)
	s.start(t)
	if err := <-done; err != nil {
		t.Fatalf("read across the server's restart: %v\n%s", err, log)
	}
	if !bytes.Equal(got, s.data[4096:4096+len(got)]) {
		t.Fatal("the bytes read across the restart differ")
	}
	log.waitFor(t, resumeLine)
	if w, r := strings.Count(log.String(), waitLine), strings.Count(log.String(), resumeLine); w != 1 || r != 1 {
		t.Fatalf("%d wait lines and %d resume lines, want 1 and 1:\n%s", w, r, log)
	}
}

// TestUnixReadWaitIsBounded: a server that stays away fails the read once
// the bound passed, not before.
func TestUnixReadWaitIsBounded(t *testing.T) {
	t.Parallel()
	s := newLayerServer(t, 64<<10)
	log := &logBuffer{}
	const bound = 400 * time.Millisecond
	u := s.open(t.Context(), t, bound, log)
	s.die()
	start := time.Now()
	_, err := u.ReadAt(make([]byte, 4096), 0)
	if err == nil || !strings.Contains(err.Error(), "the bound") || !serverDown(err) {
		t.Fatalf("read from a server that stays away: %v, want the bound's error", err)
	}
	if waited := time.Since(start); waited < bound {
		t.Fatalf("the read gave up after %s, before the bound %s", waited, bound)
	}
	if !strings.Contains(log.String(), "still unreachable") {
		t.Fatalf("the log does not say the read gave up:\n%s", log)
	}
}

// TestUnixReadVerificationFailsFast: a 422 (no source verifies the chunk)
// is no server being away: one request, an error at once, no wait.
func TestUnixReadVerificationFailsFast(t *testing.T) {
	t.Parallel()
	s := newLayerServer(t, 64<<10)
	log := &logBuffer{}
	u := s.open(t.Context(), t, time.Hour, log)
	s.corrupt.Store(true)
	before := s.reads.Load()
	_, err := u.ReadAt(make([]byte, 4096), 0)
	if err == nil || !strings.Contains(err.Error(), "422") {
		t.Fatalf("read of a chunk no source verifies: %v, want a 422", err)
	}
	if n := s.reads.Load() - before; n != 1 {
		t.Fatalf("%d requests for a chunk that fails verification, want 1", n)
	}
	if strings.Contains(log.String(), waitLine) {
		t.Fatalf("a verification failure was waited on:\n%s", log)
	}
}

// TestUnixReadBrokenAnswersAreNotWaitedOn: a server that keeps cutting its
// answers while it accepts connections has a bug: the read fails after a
// few attempts instead of waiting out the bound.
func TestUnixReadBrokenAnswersAreNotWaitedOn(t *testing.T) {
	t.Parallel()
	s := newLayerServer(t, 64<<10)
	u := s.open(t.Context(), t, time.Hour, &logBuffer{})
	s.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reads.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	before := s.reads.Load()
	_, err := u.ReadAt(make([]byte, 4096), 0)
	if err == nil || !strings.Contains(err.Error(), "broke off") {
		t.Fatalf("read from a server that cuts every answer: %v", err)
	}
	if n := s.reads.Load() - before; n != maxBroken+1 {
		t.Fatalf("%d requests, want %d", n, maxBroken+1)
	}
}

// TestUnixReadWaitEndsOnClose: closing the blob (its device removed, the
// daemon stopping) ends a read's wait at once; so does its context.
func TestUnixReadWaitEndsOnClose(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"close", "context"} {
		t.Run(how, func(t *testing.T) {
			s := newLayerServer(t, 64<<10)
			log := &logBuffer{}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			u := s.open(ctx, t, time.Hour, log)
			s.die()
			done := make(chan error, 1)
			go func() {
				_, err := u.ReadAt(make([]byte, 4096), 0)
				done <- err
			}()
			log.waitFor(t, waitLine)
			if how == "close" {
				u.Close()
			} else {
				cancel()
			}
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("read whose wait was ended: %v, want context.Canceled", err)
			}
		})
	}
}
