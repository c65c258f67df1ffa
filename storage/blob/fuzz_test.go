package blob

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

func FuzzParseBearer(f *testing.F) {
	f.Add(`Bearer realm="https://auth/token",service="reg",scope="repository:a/b:pull,push"`)
	f.Add(`Bearer realm=x,service=y`)
	f.Add(`Bearer realm="unterminated`)
	f.Fuzz(func(t *testing.T, s string) {
		parseBearer(s)
	})
}

func FuzzTotalSize(f *testing.F) {
	f.Add("bytes 0-0/1234")
	f.Add("bytes */10")
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := totalSize(s); err == nil && n < 0 {
			t.Fatalf("negative size %d from %q", n, s)
		}
	})
}

var refContentRange = regexp.MustCompile(`^bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)$`)

// FuzzContentRange: contentRange accepts exactly the RFC 9110 form with
// first <= last < total, and gives back its numbers.
func FuzzContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-0/1", "bytes 5-9/10", "bytes 0-9/*", "bytes */10", "bytes +1-2/3", "bytes 9-5/10",
		"bytes 0-9223372036854775807/9223372036854775807", "bytes 00-01/02", "bytes 1-2/3 ", "bytes  1-2/3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last, total, err := contentRange(s)
		m := refContentRange.FindStringSubmatch(s)
		want := m != nil
		var wf, wl, wt int64 = 0, 0, -1
		if want {
			var e1, e2, e3 error
			wf, e1 = strconv.ParseInt(m[1], 10, 64)
			wl, e2 = strconv.ParseInt(m[2], 10, 64)
			if m[3] != "*" {
				wt, e3 = strconv.ParseInt(m[3], 10, 64)
			}
			want = e1 == nil && e2 == nil && e3 == nil && wf <= wl && (wt < 0 || wl < wt)
		}
		if (err == nil) != want {
			t.Fatalf("contentRange(%q): err %v, reference accepts: %v", s, err, want)
		}
		if err == nil && (first != wf || last != wl || total != wt) {
			t.Fatalf("contentRange(%q) = %d %d %d, want %d %d %d", s, first, last, total, wf, wl, wt)
		}
	})
}

// answerTransport answers every request with the raw HTTP response bytes
// it holds (whatever they are), as a hostile server or proxy would: probe
// until opened is set, read after. (Telling them apart by the Range header
// would answer a one-byte read at offset 0 with the probe.)
type answerTransport struct {
	probe, read []byte
	opened      bool
}

func (a *answerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	raw := a.read
	if !a.opened {
		raw = a.probe
	}
	return http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
}

// FuzzHTTPAnswer: whatever a server answers, OpenHTTP and ReadAt neither
// panic nor hand out bytes unless the answer was a 206 whose Content-Range
// is exactly the range asked for, and then they are the answer's body.
func FuzzHTTPAnswer(f *testing.F) {
	ok := func(cr, body string) []byte {
		return fmt.Appendf(nil, "HTTP/1.1 206 Partial Content\r\nContent-Range: %s\r\nContent-Length: %d\r\n\r\n%s", cr, len(body), body)
	}
	f.Add(ok("bytes 0-0/100", "a"), ok("bytes 10-14/100", "hello"), uint8(10), uint8(5))
	f.Add(ok("bytes 0-0/100", "a"), ok("bytes 0-4/100", "hello"), uint8(10), uint8(5))
	f.Add(ok("bytes 0-0/100", "a"), ok("bytes 98-99/100", "hi"), uint8(98), uint8(5))
	f.Add(ok("bytes 0-0/1", "0"), []byte("0"), uint8(0), uint8(1))
	f.Add(ok("bytes 0-0/*", "a"), []byte("HTTP/1.1 200 OK\r\n\r\nall"), uint8(0), uint8(3))
	f.Add([]byte("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://x/\"\r\n\r\n"), []byte("garbage"), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, probe, read []byte, off, n uint8) {
		answers := &answerTransport{probe: probe, read: read}
		client := &http.Client{Transport: answers}
		h, err := OpenHTTP(context.Background(), "http://blob.invalid/x", HTTPOptions{Client: client, Retries: 1})
		if err != nil {
			return
		}
		answers.opened = true
		if h.Size() < 0 {
			t.Fatalf("size %d", h.Size())
		}
		p := make([]byte, n)
		got, err := h.ReadAt(p, int64(off))
		if err != nil && !errors.Is(err, io.EOF) || got == 0 {
			return
		}
		resp, rerr := http.ReadResponse(bufio.NewReader(bytes.NewReader(read)), nil)
		if rerr != nil || resp.StatusCode != http.StatusPartialContent {
			t.Fatalf("ReadAt gave %d bytes from a non-206 answer %q", got, read)
		}
		want := fmt.Sprintf("bytes %d-%d/%d", off, int64(off)+int64(got)-1, h.Size())
		first, last, total, cerr := contentRange(resp.Header.Get("Content-Range"))
		if cerr != nil || fmt.Sprintf("bytes %d-%d/%d", first, last, total) != want {
			t.Fatalf("ReadAt(%d, +%d) accepted Content-Range %q, want %q", off, got, resp.Header.Get("Content-Range"), want)
		}
		body, _ := io.ReadAll(resp.Body)
		if !bytes.HasPrefix(body, p[:got]) {
			t.Fatalf("ReadAt returned %q, not the answer's body %q", p[:got], body)
		}
	})
}
