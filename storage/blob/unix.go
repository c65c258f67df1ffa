package blob

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// A blob served over HTTP on a local Unix socket is named
//
//	http+unix://<socket path>:<request URI>
//
// e.g. http+unix:///var/lib/aenv/layers.sock:/v1/lazy/sha256/<hex>?size=…
// (the convention nginx uses for its upstreams). The socket path is
// absolute and holds no ':'; the request URI starts with '/'. Only
// processes allowed to open the socket read such a blob, so a node can
// serve layers to its own storage daemon without opening a TCP port.
const unixScheme = "http+unix://"

// UnixURL names the blob at requestURI on the HTTP server listening on the
// Unix socket at socket.
func UnixURL(socket, requestURI string) string {
	return unixScheme + socket + ":" + requestURI
}

// ParseUnixURL splits a http+unix URL into its socket path and request URI.
func ParseUnixURL(ref string) (socket, requestURI string, err error) {
	rest, ok := strings.CutPrefix(ref, unixScheme)
	if !ok {
		return "", "", fmt.Errorf("blob %q: not a %s URL", ref, unixScheme)
	}
	socket, requestURI, ok = strings.Cut(rest, ":")
	switch {
	case !ok || !path.IsAbs(socket) || path.Clean(socket) != socket:
		return "", "", fmt.Errorf("blob %q: want %s<absolute socket path>:<request URI>", ref, unixScheme)
	case !strings.HasPrefix(requestURI, "/"):
		return "", "", fmt.Errorf("blob %q: the request URI must start with /", ref)
	case strings.ContainsFunc(rest, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "", "", fmt.Errorf("blob %q: spaces or control characters", ref)
	}
	if _, err := url.ParseRequestURI(requestURI); err != nil {
		return "", "", fmt.Errorf("blob %q: %w", ref, err)
	}
	return socket, requestURI, nil
}

// unixRetries is how many attempts a read of a Unix-socket blob makes
// when the server answers but not with the bytes (a 5xx: the store or a
// peer behind it did not answer). The waits grow by 100 ms an attempt:
// about 45 s in all. A server that is away altogether is waited for
// apart from these (unixwait.go).
const unixRetries = 30

// openUnix opens a http+unix blob: the same range requests as HTTP, over
// connections to the socket, waiting for the server while it is away.
// Close ends the waits of the blob's reads.
func openUnix(ctx context.Context, ref string, opt HTTPOptions) (*unixBlob, error) {
	socket, requestURI, err := ParseUnixURL(ref)
	if err != nil {
		return nil, err
	}
	if opt.Client == nil {
		var d net.Dialer
		opt.Client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", socket)
			},
			MaxIdleConnsPerHost: 16,
		}}
	}
	if opt.Retries <= 0 {
		opt.Retries = unixRetries
	}
	if opt.ServerWait <= 0 {
		opt.ServerWait = DefaultServerWait
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	u := &unixBlob{
		HTTP:   &HTTP{url: "http://unix" + requestURI, name: ref, opt: opt, ctx: ctx, away: serverAway},
		wait:   opt.ServerWait,
		cancel: cancel,
		out:    outageOf(socket, opt.Log),
	}
	if err := u.waitServer(u.HTTP.probe); err != nil {
		cancel()
		return nil, fmt.Errorf("open blob %s: %w", ref, err)
	}
	return u, nil
}

// URLDigest returns the sha256 digest ("sha256:<hex>") a content-addressed
// blob URL names in its path: a last segment "sha256:<hex>" (an OCI
// registry's blob URL) or the last two "sha256/<hex>" (a peer's or the
// node's layer endpoint). ok is false for a URL that names none.
func URLDigest(ref string) (digest string, ok bool) {
	p := ref
	if strings.HasPrefix(ref, unixScheme) {
		_, requestURI, err := ParseUnixURL(ref)
		if err != nil {
			return "", false
		}
		p = requestURI
	}
	u, err := url.Parse(p)
	if err != nil {
		return "", false
	}
	segs := strings.Split(strings.TrimSuffix(u.Path, "/"), "/")
	last := segs[len(segs)-1]
	if h, ok := strings.CutPrefix(last, "sha256:"); ok && isHexDigest(h) {
		return "sha256:" + h, true
	}
	if len(segs) >= 2 && segs[len(segs)-2] == "sha256" && isHexDigest(last) {
		return "sha256:" + last, true
	}
	return "", false
}

func isHexDigest(h string) bool {
	if len(h) != 64 || strings.ToLower(h) != h {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}
