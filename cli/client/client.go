// Package client is the aenv CLI's client of aenvd: the E2B-compatible
// control API (over the generated types in package api) and, through the
// node's sandbox proxy, the in-sandbox agent (processes and files).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
)

// Client talks to one aenvd.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
}

// New returns a client of the aenvd at baseURL.
func New(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{}}
}

// APIError is an error answer of the control API.
type APIError struct {
	Op      string // what was attempted, e.g. "pause sandbox abc"
	Status  int
	Message string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("%s: server answered %d: %s", e.Op, e.Status, e.Message)
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += " (check the API key: run `aenv auth` or set AENV_API_KEY)"
	case http.StatusNotFound:
		if strings.Contains(e.Op, "sandbox ") {
			msg += " (see `aenv list` for the sandboxes that exist)"
		} else if strings.Contains(e.Op, "template ") {
			msg += " (see `aenv template list`)"
		}
	}
	return msg
}

// ErrUnsupported marks routes this server does not have (404 or 405 from the
// router rather than for an object).
var ErrUnsupported = errors.New("not supported by this server")

// NotFound reports whether err is an API 404.
func NotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// do sends a request with an optional JSON body and decodes a JSON answer
// into out (nil: discard). It returns the response headers and status.
func (c *Client) do(ctx context.Context, op, method, path string, body, out any) (http.Header, int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: encode request: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("X-API-Key", c.APIKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, 0, c.transportError(op, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("%s: read answer: %w", op, err)
	}
	if resp.StatusCode >= 400 {
		var e wire.Error
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		ae := &APIError{Op: op, Status: resp.StatusCode, Message: e.Message}
		if (resp.StatusCode == http.StatusNotFound && strings.HasPrefix(e.Message, "no route ")) || resp.StatusCode == http.StatusMethodNotAllowed {
			return resp.Header, resp.StatusCode, fmt.Errorf("%s: %w (%s %s answered %d; upgrade aenvd)", op, ErrUnsupported, method, path, resp.StatusCode)
		}
		return resp.Header, resp.StatusCode, ae
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.Header, resp.StatusCode, fmt.Errorf("%s: decode answer: %w", op, err)
		}
	}
	return resp.Header, resp.StatusCode, nil
}

func (c *Client) transportError(op string, err error) error {
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return fmt.Errorf("%s: cannot reach aenvd at %s: %w (is aenvd running? set the URL with `aenv auth` or AENV_URL)", op, c.BaseURL, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Health checks GET /health (no key needed).
func (c *Client) Health(ctx context.Context) error {
	_, _, err := c.do(ctx, "check aenvd health", "GET", "/health", nil, nil)
	return err
}

// Create starts a sandbox from a template.
func (c *Client) Create(ctx context.Context, req wire.NewSandbox) (wire.Sandbox, error) {
	var s wire.Sandbox
	_, _, err := c.do(ctx, "create a sandbox from template "+req.TemplateID, "POST", "/sandboxes", req, &s)
	return s, err
}

// ListOptions filter List.
type ListOptions struct {
	States   []string          // running, paused; empty means both
	Metadata map[string]string // all must match
	PageSize int               // 1..100, 0 means the server's default
}

// List returns every sandbox (all pages of GET /v2/sandboxes).
func (c *Client) List(ctx context.Context, o ListOptions) ([]wire.ListedSandbox, error) {
	q := url.Values{}
	if len(o.States) > 0 {
		q.Set("state", strings.Join(o.States, ","))
	}
	if len(o.Metadata) > 0 {
		md := url.Values{}
		for k, v := range o.Metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	if o.PageSize > 0 {
		q.Set("limit", fmt.Sprint(o.PageSize))
	}
	return listAll[wire.ListedSandbox](ctx, c, "list sandboxes", "/v2/sandboxes", q)
}

// listAll reads every page of a paginated list: each answer's X-Next-Token
// asks for the next page, until there is none or a page is empty.
func listAll[T any](ctx context.Context, c *Client, op, path string, q url.Values) ([]T, error) {
	out := []T{}
	for {
		var page []T
		h, _, err := c.do(ctx, op, "GET", withQuery(path, q), nil, &page)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		next := h.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return out, nil
		}
		q.Set("nextToken", next)
	}
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (wire.SandboxDetail, error) {
	var d wire.SandboxDetail
	_, _, err := c.do(ctx, "get sandbox "+id, "GET", "/sandboxes/"+url.PathEscape(id), nil, &d)
	return d, err
}

// Kill deletes a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, _, err := c.do(ctx, "remove sandbox "+id, "DELETE", "/sandboxes/"+url.PathEscape(id), nil, nil)
	return err
}

// Pause snapshots a running sandbox; memory false keeps only its
// filesystem (its resume cold-boots).
func (c *Client) Pause(ctx context.Context, id string, memory bool) error {
	_, _, err := c.do(ctx, "pause sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/pause", wire.SandboxPauseRequest{Memory: &memory}, nil)
	return err
}

// Connect resumes a paused sandbox (or extends a running one's timeout)
// and returns it; resumed reports whether it was paused. timeout 0 keeps
// the server's default; memory false resumes from the disk alone (a cold
// boot).
func (c *Client) Connect(ctx context.Context, id string, timeoutSecs int32, memory bool) (s wire.Sandbox, resumed bool, err error) {
	req := wire.ConnectSandbox{Memory: &memory}
	if timeoutSecs > 0 {
		req.Timeout = &timeoutSecs
	}
	_, status, err := c.do(ctx, "connect to sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/connect", req, &s)
	return s, status == http.StatusCreated, err
}

// SetTimeout sets the remaining lifetime of a sandbox.
func (c *Client) SetTimeout(ctx context.Context, id string, secs int32) error {
	_, _, err := c.do(ctx, "set the timeout of sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/timeout", wire.SandboxTimeout{Timeout: secs}, nil)
	return err
}

// ForkResult is one child of a fork: a sandbox or an error.
type ForkResult struct {
	Sandbox *wire.Sandbox `json:"sandbox,omitempty"`
	Error   *wire.Error   `json:"error,omitempty"`
}

// Fork clones a running sandbox count times.
func (c *Client) Fork(ctx context.Context, id string, count int, timeoutSecs int32) ([]ForkResult, error) {
	req := map[string]any{"count": count}
	if timeoutSecs > 0 {
		req["timeout"] = timeoutSecs
	}
	var out []ForkResult
	_, _, err := c.do(ctx, "fork sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/fork", req, &out)
	return out, err
}

// Snapshot is a named, persistent snapshot of a sandbox.
type Snapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	SandboxID  string   `json:"sandboxID,omitempty"`
	// Repository says where the snapshot lives beyond its node ("" none;
	// pending, uploading, uploaded, failed).
	Repository string `json:"repository,omitempty"`
}

// CreateSnapshot snapshots a sandbox under an optional name.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (Snapshot, error) {
	req := map[string]any{}
	if name != "" {
		req["name"] = name
	}
	var s Snapshot
	_, _, err := c.do(ctx, "snapshot sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/snapshots", req, &s)
	return s, err
}

// ListSnapshots returns the snapshots, optionally of one sandbox (all pages).
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]Snapshot, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandboxID", sandboxID)
	}
	return listAll[Snapshot](ctx, c, "list snapshots", "/snapshots", q)
}

// Templates lists the templates: GET /v2/templates (every template with its
// names, also those building or failed), else GET /templates on servers
// without it.
func (c *Client) Templates(ctx context.Context) ([]wire.Template, error) {
	out := []wire.Template{}
	_, _, err := c.do(ctx, "list templates", "GET", "/v2/templates", nil, &out)
	if errors.Is(err, ErrUnsupported) {
		out = []wire.Template{}
		_, _, err = c.do(ctx, "list templates", "GET", "/templates", nil, &out)
	}
	return out, err
}

// DeleteTemplate removes a template.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	_, _, err := c.do(ctx, "remove template "+id, "DELETE", "/templates/"+url.PathEscape(id), nil, nil)
	return err
}

// Nodes lists the nodes.
func (c *Client) Nodes(ctx context.Context) ([]wire.Node, error) {
	out := []wire.Node{}
	_, _, err := c.do(ctx, "list nodes", "GET", "/nodes", nil, &out)
	return out, err
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// Refresh extends a sandbox's lifetime to at least secs from now (it never
// shortens it).
func (c *Client) Refresh(ctx context.Context, id string, secs int32) error {
	_, _, err := c.do(ctx, "refresh sandbox "+id, "POST", "/sandboxes/"+url.PathEscape(id)+"/refreshes", wire.SandboxRefresh{Duration: &secs}, nil)
	return err
}
