// Package proxy forwards sandbox traffic to the guest: requests name their
// sandbox and port by the E2b-Sandbox-Id / E2b-Sandbox-Port headers (which
// are stripped) or by the host {port}-{id}.{domain}. Paused and unknown
// sandboxes answer 502 (unless auto-resume brings a paused one back);
// sandboxes created with allowPublicTraffic false answer 403 on ports other
// than the agent's without their E2b-Traffic-Access-Token; streaming
// responses and WebSocket upgrades pass through.
//
// Control-plane credentials never reach a guest: X-API-Key, the routing
// and traffic-token headers, Proxy-Authorization, and any Authorization
// header or cookie carrying the node's API key are removed; the agent's
// X-Access-Token only goes to the agent's port. The package also owns the
// per-client connection limit of the node's listeners (LimitPerClient).
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Header names the SDK sets when E2B_SANDBOX_URL is used.
const (
	HeaderSandboxID    = "E2b-Sandbox-Id"
	HeaderSandboxPort  = "E2b-Sandbox-Port"
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
)

// AgentPort is the guest agent's port (E2B's envd port): requests to it
// carry the agent's access token and pass without a traffic token.
const AgentPort = 49983

// Sandbox is what the proxy knows of one sandbox: whether it answers,
// whether traffic may resume it, and the credentials its requests carry.
type Sandbox struct {
	// Killing answers as an unknown sandbox.
	Killing bool
	// Paused, with AutoResume and not FilesystemOnly, is resumed by traffic.
	Paused, AutoResume, FilesystemOnly bool
	// TrafficToken, when set, is required on ports other than the agent's.
	TrafficToken string
	// MaskRequestHost is the Host header the guest sees (${PORT} replaced).
	MaskRequestHost string
	// AccessToken is the agent's token; the proxy presents it for a
	// sandbox that is not Secure.
	AccessToken string
	Secure      bool
}

// Guest dials a port inside one running sandbox.
type Guest interface {
	DialGuest(ctx context.Context, network string, port uint16) (net.Conn, error)
}

// Sandboxes is what the proxy needs of the node's sandboxes.
type Sandboxes interface {
	Get(id string) (Sandbox, error)
	// Slot returns a running sandbox's guest dialer and VM generation.
	Slot(id string) (Guest, int, error)
	// Connect resumes a paused sandbox with the given end time.
	Connect(ctx context.Context, id string, timeout time.Duration, memory bool) error
}

// Proxy is an http.Handler.
type Proxy struct {
	o      Sandboxes
	domain string
	rp     *httputil.ReverseProxy
	log    *slog.Logger
	// ResumeTimeout is the end time given to a sandbox auto-resumed by traffic.
	ResumeTimeout time.Duration
	// APIKey is the node's API key: an Authorization header or a cookie
	// carrying it is removed before forwarding (X-API-Key always is).
	APIKey string

	conns conns // upstream connections by sandbox (conns.go)
}

type targetKey struct{}

type target struct {
	id   string
	port int
}

// New returns a proxy for the orchestrator's sandboxes; domain enables host
// routing ("" disables it).
func New(o Sandboxes, domain string, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{o: o, domain: domain, log: log.With("component", "proxy"), ResumeTimeout: 5 * time.Minute}
	tr := &http.Transport{
		DialContext:         p.dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		// The client's Accept-Encoding goes to the guest as sent: otherwise
		// a request without one would be sent asking for gzip, inflated
		// here, and answered without its length.
		DisableCompression: true,
	}
	p.rp = &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.Out.URL.Scheme = "http"
			// The host names sandbox, port and VM generation, so pooled
			// connections never outlive the VM they were opened to.
			_, gen, _ := o.Slot(t.id)
			pr.Out.URL.Host = fmt.Sprintf("%s.%d.%d", t.id, gen, t.port)
			pr.Out.Host = pr.In.Host
			p.stripControlPlane(pr.Out.Header, t.port)
			rec, err := o.Get(t.id)
			if err == nil && rec.MaskRequestHost != "" {
				pr.Out.Host = maskHost(rec.MaskRequestHost, t.port)
			}
			// A non-secure sandbox's agent token is the proxy's to present.
			if err == nil && t.port == AgentPort && !rec.Secure && rec.AccessToken != "" {
				pr.Out.Header.Set("X-Access-Token", rec.AccessToken)
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			level := slog.LevelWarn
			if errors.Is(err, context.Canceled) {
				level = slog.LevelDebug // the client went away
			}
			p.log.Log(r.Context(), level, "proxy error", "path", r.URL.Path, "err", err)
			writeError(w, http.StatusBadGateway, "sandbox unreachable: "+err.Error())
		},
	}
	return p
}

// stripControlPlane removes from h what belongs to the node, not to the
// guest.
func (p *Proxy) stripControlPlane(h http.Header, port int) {
	for _, k := range []string{HeaderSandboxID, HeaderSandboxPort, HeaderTrafficToken, "X-Api-Key", "Proxy-Authorization"} {
		h.Del(k)
	}
	if port != AgentPort {
		h.Del("X-Access-Token") // the agent's credential, not an app's
	}
	if p.APIKey == "" {
		return
	}
	if slices.ContainsFunc(h.Values("Authorization"), func(v string) bool { return carriesKey(v, p.APIKey) }) {
		h.Del("Authorization")
	}
	cookies := h.Values("Cookie")
	if len(cookies) == 0 {
		return
	}
	h.Del("Cookie")
	var kept []string
	for _, line := range cookies {
		for pair := range strings.SplitSeq(line, ";") {
			if pair = strings.TrimSpace(pair); pair != "" && !carriesKey(pair, p.APIKey) {
				kept = append(kept, pair)
			}
		}
	}
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

// carriesKey reports whether a header value holds the API key, in clear
// or base64 (Basic credentials).
func carriesKey(v, key string) bool {
	if strings.Contains(v, key) {
		return true
	}
	if scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok && strings.EqualFold(scheme, "Basic") {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
		return err == nil && strings.Contains(string(raw), key)
	}
	return false
}

// Match reports whether r names a sandbox.
func (p *Proxy) Match(r *http.Request) bool {
	_, ok := p.route(r)
	return ok
}

// SandboxOf names the sandbox a request for the proxy is meant for (by its
// headers, its host or a signed /files URL), as ServeHTTP routes it.
func (p *Proxy) SandboxOf(r *http.Request) (string, bool) {
	t, ok := p.route(r)
	if !ok {
		t, ok = p.bySignature(r)
	}
	return t.id, ok && t.id != ""
}

// maxIDLen bounds a sandbox id taken from a request.
const maxIDLen = 64

// validID reports whether id can be a sandbox id: the orchestrator's are
// lower-case letters and digits; anything else (dots, colons, slashes)
// could not name a sandbox and must not reach the upstream address.
func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// route finds the sandbox and port a request names. A request with the id
// header always matches (it is meant for a sandbox, never the API); its
// id is checked by ServeHTTP.
func (p *Proxy) route(r *http.Request) (target, bool) {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		port, err := strconv.Atoi(r.Header.Get(HeaderSandboxPort))
		if err != nil || port < 1 || port > 65535 {
			port = 0
		}
		return target{id: id, port: port}, true
	}
	if p.domain == "" {
		return target{}, false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(host, "."+p.domain)
	if !ok {
		return target{}, false
	}
	portStr, id, ok := strings.Cut(label, "-")
	if !ok || !validID(id) {
		return target{}, false
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return target{}, false
	}
	return target{id: id, port: port}, true
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, ok := p.route(r)
	if !ok {
		t, ok = p.bySignature(r)
	}
	if !ok {
		writeError(w, http.StatusBadRequest, noSandboxMessage(r))
		return
	}
	if t.port == 0 {
		writeError(w, http.StatusBadRequest, "missing or invalid "+HeaderSandboxPort)
		return
	}
	if !validID(t.id) {
		writeNotFound(w, "")
		return
	}
	rec, err := p.o.Get(t.id)
	if err != nil || rec.Killing {
		writeNotFound(w, t.id)
		return
	}
	if rec.TrafficToken != "" && t.port != AgentPort &&
		subtle.ConstantTimeCompare([]byte(r.Header.Get(HeaderTrafficToken)), []byte(rec.TrafficToken)) != 1 {
		writeError(w, http.StatusForbidden, "sandbox "+t.id+" requires "+HeaderTrafficToken)
		return
	}
	if _, _, err := p.o.Slot(t.id); err != nil {
		if !p.autoResume(r.Context(), t.id) {
			writeNotFound(w, t.id)
			return
		}
	}
	// Full duplex: otherwise, once the upstream response starts, net/http's
	// HTTP/1.1 server drains and closes the request body under the
	// transport that is still forwarding it, and the transport then closes
	// the upstream connection mid-response ("use of closed network
	// connection"), cutting agent streams short.
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// noSandboxMessage explains a request that names no sandbox; an unsigned
// /files URL is what the SDK's downloadUrl/uploadUrl give for a sandbox
// created without secure when E2B_SANDBOX_URL is set.
func noSandboxMessage(r *http.Request) string {
	if r.URL.Path == "/files" && !r.URL.Query().Has("signature") {
		return "request names no sandbox: an unsigned /files URL (E2B_SANDBOX_URL set, sandbox not secure) " +
			"does not name its sandbox; send " + HeaderSandboxID + " and " + HeaderSandboxPort +
			", create the sandbox secure (signed URLs are routed by their signature), or use host routing"
	}
	if r.URL.Path == "/files" {
		return "request names no sandbox: no running sandbox's access token made this /files signature"
	}
	return "request names no sandbox"
}

// autoResume resumes a paused sandbox that asked for it; true when it runs.
func (p *Proxy) autoResume(ctx context.Context, id string) bool {
	rec, err := p.o.Get(id)
	// A filesystem-only pause is resumed by an explicit call only: traffic
	// would reach a freshly booted guest, not the processes it was meant for.
	if err != nil || !rec.AutoResume || !rec.Paused || rec.FilesystemOnly {
		return false
	}
	if err := p.o.Connect(ctx, id, p.ResumeTimeout, true); err != nil {
		p.log.Warn("auto-resume failed", "sandbox", id, "err", err)
		return false
	}
	return true
}

// dial connects to "<id>.<gen>.<port>" inside the sandbox's network slot.
func (p *Proxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	parts := strings.Split(host, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("proxy: bad upstream %q", addr)
	}
	port, err := strconv.Atoi(parts[2])
	if err != nil {
		return nil, fmt.Errorf("proxy: bad upstream %q", addr)
	}
	slot, gen, err := p.o.Slot(parts[0])
	if err != nil {
		return nil, err
	}
	if strconv.Itoa(gen) != parts[1] {
		return nil, errors.New("proxy: sandbox restarted since the request was routed")
	}
	c, err := slot.DialGuest(ctx, "tcp", uint16(port))
	if err != nil {
		return nil, err
	}
	return p.conns.track(parts[0], c), nil
}

// maskHost is the Host header a sandbox created with maskRequestHost sees:
// the mask with ${PORT} replaced by the port the request was routed to.
func maskHost(mask string, port int) string {
	return strings.ReplaceAll(mask, "${PORT}", strconv.Itoa(port))
}

// notFoundMessage is E2B's message for a sandbox its proxy cannot reach;
// the SDKs turn a 502 into their "sandbox was not found / timed out" error.
const notFoundMessage = "The sandbox was not found"

// writeNotFound answers a request for a sandbox that is unknown, killed or
// not running, in the shape of E2B's proxy: {"sandboxId","message","code"}.
func writeNotFound(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	_ = json.NewEncoder(w).Encode(struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}{id, notFoundMessage, http.StatusBadGateway})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}
