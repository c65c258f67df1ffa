// Package blob owns the byte sources that layer files are read from: a local
// file (pread), an HTTP(S) URL read with range requests (a layer on a web
// server or an OCI registry blob URL), a block cache with read-ahead and a
// size limit that sits in front of a remote source, and verified reads: a
// layer's chunk digest table (chunks.go) against which every chunk fetched
// from a remote source is checked before it is cached or served
// (verified.go).
package blob

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Blob is a read-only, random-access byte source of known size.
type Blob interface {
	io.ReaderAt
	Size() int64
	Name() string
	Close() error
}

// File is a local file read with pread.
type File struct {
	f     *os.File
	fd    int
	size  int64
	guard fdGuard
}

// OpenFile opens a local file.
func OpenFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open blob %s: %w", path, err)
	}
	return &File{f: f, fd: int(f.Fd()), size: st.Size()}, nil
}

func (b *File) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }
func (b *File) Size() int64                             { return b.size }
func (b *File) Name() string                            { return b.f.Name() }

// Close closes the file once reads using its descriptor are done.
func (b *File) Close() error {
	b.guard.closeWait()
	return b.f.Close()
}

// HTTPOptions configure an HTTP blob.
type HTTPOptions struct {
	Client  *http.Client // default: a client with a 60 s timeout
	Header  http.Header  // extra headers, e.g. Authorization for a registry
	Retries int          // attempts per request; default 3

	// ServerWait bounds how long a read of a http+unix blob waits for the
	// server behind its socket while that server is away (the socket
	// refuses connections, is missing, or an answer breaks off): the
	// process serving it is restarting. Default DefaultServerWait.
	ServerWait time.Duration
	// Log receives the once-per-outage lines of such waits; default
	// slog.Default().
	Log *slog.Logger
	// ReadAhead is the blocks the cache over the blob fetches in one
	// request on sequential misses (CacheOptions.ReadAhead): 0 the
	// cache's default, 1 none (a guest's memory, whose mapping reads
	// around every fault itself: another read-ahead under it fetches what
	// no fault asked for).
	ReadAhead int
}

// HTTP is a remote blob read with range requests. A registry that answers
// 401 with a Bearer challenge gets an anonymous token from its realm (the
// OCI distribution token flow), reused for later requests.
type HTTP struct {
	url   string
	name  string // what Name reports (the http+unix URL of a socket blob)
	opt   HTTPOptions
	ctx   context.Context
	size  int64
	mu    sync.Mutex
	token string
	// away, when set, names the errors get hands back at once instead of
	// retrying them: its caller waits for the server itself (unix.go).
	away func(error) bool
}

// OpenHTTP probes url for its size and range support. ctx bounds every later
// request too (ReaderAt has no context of its own).
func OpenHTTP(ctx context.Context, url string, opt HTTPOptions) (*HTTP, error) {
	if opt.Client == nil {
		opt.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if opt.Retries <= 0 {
		opt.Retries = 3
	}
	h := &HTTP{url: url, name: url, opt: opt, ctx: ctx}
	if err := h.probe(); err != nil {
		return nil, fmt.Errorf("open blob %s: %w", url, err)
	}
	return h, nil
}

// probe learns the blob's size with a one-byte range request.
func (h *HTTP) probe() error {
	resp, err := h.get(0, 1, -1)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	size, err := totalSize(resp.Header.Get("Content-Range"))
	if err != nil {
		return err
	}
	h.size = size
	return nil
}

// totalSize parses "bytes a-b/N" and returns N.
func totalSize(cr string) (int64, error) {
	_, _, n, err := contentRange(cr)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("bad Content-Range %q (unknown total size)", cr)
	}
	return n, nil
}

// contentRange parses the Content-Range of a 206 answer, "bytes
// first-last/total" (RFC 9110 14.4), total -1 for "*". Numbers are plain
// decimal digits that fit an int64, and first <= last < total.
func contentRange(cr string) (first, last, total int64, err error) {
	bad := fmt.Errorf("bad Content-Range %q", cr)
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, 0, 0, bad
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	f, l, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	if first, ok = decimal(f); !ok {
		return 0, 0, 0, bad
	}
	if last, ok = decimal(l); !ok || last < first {
		return 0, 0, 0, bad
	}
	total = -1
	if tot != "*" {
		if total, ok = decimal(tot); !ok || last >= total {
			return 0, 0, 0, bad
		}
	}
	return first, last, total, nil
}

// ParseContentRange parses the Content-Range of a 206 answer as the HTTP
// backend does (first <= last < total; total -1 for "*"), for other clients
// of range requests (the S3 backend of the snapshot repository).
func ParseContentRange(cr string) (first, last, total int64, err error) { return contentRange(cr) }

// decimal parses a non-empty string of ASCII digits (no sign, no spaces)
// that fits an int64.
func decimal(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// checkRange checks that a 206 answer carries the range [off, off+n) of a
// blob of size total (any size when total < 0): a server (or anything on
// the way) answering with other bytes is an error, not data.
func checkRange(resp *http.Response, off, n, total int64) error {
	cr := resp.Header.Get("Content-Range")
	first, last, size, err := contentRange(cr)
	if err != nil {
		return err
	}
	if first != off || last != off+n-1 {
		return fmt.Errorf("Content-Range %q answers another range than bytes=%d-%d", cr, off, off+n-1)
	}
	if total >= 0 && size != total {
		return fmt.Errorf("Content-Range %q: the blob is no longer %d bytes", cr, total)
	}
	if size < 0 {
		return fmt.Errorf("bad Content-Range %q (unknown total size)", cr)
	}
	return nil
}

// get requests [off, off+n) of a blob of size total (any when < 0) and
// returns a 206 response whose Content-Range says it holds exactly that.
func (h *HTTP) get(off, n, total int64) (*http.Response, error) {
	var last error
	for attempt := 0; attempt < h.opt.Retries; attempt++ {
		if attempt > 0 {
			select {
			case <-h.ctx.Done():
				return nil, h.ctx.Err()
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			}
		}
		req, err := http.NewRequestWithContext(h.ctx, http.MethodGet, h.url, nil)
		if err != nil {
			return nil, err
		}
		for k, v := range h.opt.Header {
			req.Header[k] = v
		}
		h.mu.Lock()
		if h.token != "" {
			req.Header.Set("Authorization", "Bearer "+h.token)
		}
		h.mu.Unlock()
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
		resp, err := h.opt.Client.Do(req)
		if err != nil {
			if h.away != nil && h.away(err) {
				return nil, err
			}
			last = err
			continue
		}
		if resp.StatusCode == http.StatusUnauthorized && req.Header.Get("Authorization") == "" {
			challenge := resp.Header.Get("WWW-Authenticate")
			resp.Body.Close()
			if err := h.fetchToken(challenge); err != nil {
				return nil, fmt.Errorf("status 401 Unauthorized: %w", err)
			}
			last = fmt.Errorf("status 401 Unauthorized")
			attempt-- // the retry with a token is not a failure
			continue
		}
		switch {
		case resp.StatusCode == http.StatusPartialContent:
			if err := checkRange(resp, off, n, total); err != nil {
				resp.Body.Close()
				return nil, err
			}
			return resp, nil
		case resp.StatusCode == http.StatusOK:
			resp.Body.Close()
			return nil, fmt.Errorf("server ignored the range request (status 200); range support is required")
		case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
			resp.Body.Close()
			last = fmt.Errorf("status %s", resp.Status)
			continue
		default:
			resp.Body.Close()
			return nil, fmt.Errorf("status %s", resp.Status)
		}
	}
	return nil, fmt.Errorf("after %d attempts: %w", h.opt.Retries, last)
}

// fetchToken answers a Bearer challenge with an anonymous token request.
func (h *HTTP) fetchToken(challenge string) error {
	params, ok := parseBearer(challenge)
	if !ok || params["realm"] == "" {
		return fmt.Errorf("no Bearer challenge to answer (WWW-Authenticate %q)", challenge)
	}
	u, err := url.Parse(params["realm"])
	if err != nil {
		return fmt.Errorf("bad token realm %q: %w", params["realm"], err)
	}
	q := u.Query()
	for _, k := range []string{"service", "scope"} {
		if v := params[k]; v != "" {
			q.Set(k, v)
		}
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(h.ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := h.opt.Client.Do(req)
	if err != nil {
		return fmt.Errorf("token request: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("token request to %s: status %s", u.Redacted(), resp.Status)
	}
	var body struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return fmt.Errorf("token response: %w", err)
	}
	tok := cmp.Or(body.Token, body.AccessToken)
	if tok == "" {
		return fmt.Errorf("token response from %s has no token", u.Redacted())
	}
	h.mu.Lock()
	h.token = tok
	h.mu.Unlock()
	return nil
}

// parseBearer parses `Bearer realm="...",service="...",scope="..."`.
func parseBearer(ch string) (map[string]string, bool) {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(ch), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	out := map[string]string{}
	for rest != "" {
		var kv string
		// Values are quoted and may contain commas (scopes do).
		k, after, ok := strings.Cut(strings.TrimLeft(rest, " ,"), "=")
		if !ok {
			break
		}
		if strings.HasPrefix(after, `"`) {
			end := strings.IndexByte(after[1:], '"')
			if end < 0 {
				return nil, false
			}
			kv, rest = after[1:1+end], after[2+end:]
		} else {
			kv, rest, _ = strings.Cut(after, ",")
		}
		out[strings.ToLower(strings.TrimSpace(k))] = kv
	}
	return out, true
}

// ReadAt reads with one range request.
func (h *HTTP) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read blob %s: negative offset", h.name)
	}
	if off >= h.size {
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > h.size-off {
		p, eof = p[:h.size-off], io.EOF
	}
	if len(p) == 0 {
		return 0, eof
	}
	resp, err := h.get(off, int64(len(p)), h.size)
	if err != nil {
		return 0, fmt.Errorf("read blob %s [%d,+%d): %w", h.name, off, len(p), err)
	}
	defer resp.Body.Close()
	n, err := io.ReadFull(resp.Body, p)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return n, fmt.Errorf("read blob %s [%d,+%d): %w", h.name, off, len(p), err)
	}
	return n, eof
}

func (h *HTTP) Size() int64  { return h.size }
func (h *HTTP) Name() string { return h.name }
func (h *HTTP) Close() error { return nil }

// IsURL reports whether ref names an HTTP(S) blob, or one served over HTTP
// on a local Unix socket (unix.go).
func IsURL(ref string) bool {
	return strings.HasPrefix(ref, "http://") || strings.HasPrefix(ref, "https://") || strings.HasPrefix(ref, unixScheme)
}

// unixCache is the block cache of a Unix-socket blob: the server is on this
// node and keeps its own cache, so this one only merges sequential reads
// (read-ahead) and keeps the blocks just read.
const unixCache = 16 << 20

// Open opens a local path (read with pread) or, for a URL, a cached HTTP
// blob (over the Unix socket a http+unix URL names).
func Open(ctx context.Context, ref string, opt HTTPOptions) (Blob, error) {
	if !IsURL(ref) {
		return OpenFile(ref)
	}
	if strings.HasPrefix(ref, unixScheme) {
		h, err := openUnix(ctx, ref, opt)
		if err != nil {
			return nil, err
		}
		return NewCache(h, CacheOptions{Capacity: unixCache, ReadAhead: opt.ReadAhead}), nil
	}
	h, err := OpenHTTP(ctx, ref, opt)
	if err != nil {
		return nil, err
	}
	return NewCache(h, CacheOptions{ReadAhead: opt.ReadAhead}), nil
}
