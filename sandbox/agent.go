package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/network"
)

// AgentPort is the in-guest agent's port.
const AgentPort = 49983

// AgentClient is an HTTP client whose connections reach the agent of the
// guest in slot (timeout 0: none).
func AgentClient(slot *network.Slot, timeout time.Duration) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return slot.DialGuest(ctx, "tcp", AgentPort)
	}}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// WaitAgent polls the agent's /health until it answers 2xx.
func WaitAgent(ctx context.Context, slot *network.Slot, limit time.Duration) error {
	_, err := waitAgent(ctx, slot, limit)
	return err
}

// waitAgent is WaitAgent that also says how many requests it took.
func waitAgent(ctx context.Context, slot *network.Slot, limit time.Duration) (attempts int, err error) {
	hc := AgentClient(slot, 2*time.Second)
	deadline := time.Now().Add(limit)
	for {
		attempts++
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return attempts, nil
			}
		}
		if time.Now().After(deadline) {
			return attempts, fmt.Errorf("agent did not answer /health within %s (last error: %v)", limit, err)
		}
		select {
		case <-ctx.Done():
			return attempts, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// InitRequest is the body of the agent's /init.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	AccessToken    *string           `json:"accessToken,omitempty"`
	Timestamp      time.Time         `json:"timestamp"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	// Drives are guest disks ("vdb") whose slot got a disk since the
	// guest last saw it: the agent has them probed again.
	Drives []string `json:"drives,omitempty"`
	// HostTSCkHz is the TSC frequency of this host, which a TCG guest's
	// clock follows: the agent corrects its clock's rate for it (a
	// snapshot taken on a host with another TSC). 0 (KVM) leaves it alone.
	HostTSCkHz int `json:"hostTscKhz,omitempty"`
}

// InitAgent posts /init (env vars, access token, clock), retrying briefly
// while the restored guest's network settles.
func InitAgent(ctx context.Context, slot *network.Slot, held string, req InitRequest) error {
	_, err := InitAgentVersion(ctx, slot, held, req)
	return err
}

// InitAgentVersion is InitAgent that also returns the protocol version the
// agent reports in its answer (X-Envd-Version; "" when it sends none).
func InitAgentVersion(ctx context.Context, slot *network.Slot, held string, req InitRequest) (string, error) {
	hc := AgentClient(slot, 5*time.Second)
	var last error
	for attempt := 0; attempt < 100; attempt++ {
		req.Timestamp = time.Now().UTC()
		body, _ := json.Marshal(req)
		hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/init", bytes.NewReader(body))
		hr.Header.Set("Content-Type", "application/json")
		switch {
		case held != "":
			// The agent already holds a token (a resume, or a snapshot of a
			// secure sandbox): a re-init must present it.
			hr.Header.Set("X-Access-Token", held)
		case req.AccessToken != nil && *req.AccessToken != "":
			// A retry after the first attempt set the token.
			hr.Header.Set("X-Access-Token", *req.AccessToken)
		}
		resp, err := hc.Do(hr)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return reportedVersion(resp.Header), nil
			}
			return "", fmt.Errorf("agent /init: %s: %s", resp.Status, msg)
		}
		last = err
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("agent /init: %w", last)
}

// reportedVersion reads the agent's X-Envd-Version: a short dotted version
// or nothing (the header comes from the guest, which is not trusted).
func reportedVersion(h http.Header) string {
	v := h.Get("X-Envd-Version")
	if v == "" || len(v) > 32 {
		return ""
	}
	for _, r := range v {
		if !(r >= '0' && r <= '9' || r == '.' || r >= 'a' && r <= 'z' || r == '-' || r == '+') {
			return ""
		}
	}
	return v
}

// SyncGuest has the guest flush its file systems' dirty data to its disks
// (sync(1) as root through the agent's process service; token is the one
// the agent holds), so that disks sealed next hold every write made before.
func SyncGuest(ctx context.Context, slot *network.Slot, token string) error {
	if err := RunAsRoot(ctx, slot, token, "/bin/sync"); err != nil {
		return fmt.Errorf("sync the guest's file systems: %w", err)
	}
	return nil
}

// RunAsRoot runs argv in the guest as root through the agent's process
// service (token is the one the agent holds); a non-zero exit is an error
// carrying the tail of its stderr.
func RunAsRoot(ctx context.Context, slot *network.Slot, token string, argv ...string) error {
	_, stderr, code, err := Guest{Slot: slot, Token: token}.Run(ctx, argv...)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%s: exit %d: %s", argv[0], code, tail(stderr, 200))
	}
	return nil
}

// Guest is a running sandbox's guest as root, reached through its agent
// in Slot (Token: the access token the agent holds, "" for none).
type Guest struct {
	Slot  *network.Slot
	Token string
}

// Run runs argv as root and returns its output and exit code; err only
// when it could not run or its stream broke.
func (g Guest) Run(ctx context.Context, argv ...string) (stdout, stderr []byte, code int, err error) {
	opts := []agentclient.Option{agentclient.WithUser("root")}
	if g.Token != "" {
		opts = append(opts, agentclient.WithToken(g.Token))
	}
	return agentclient.RunWith(ctx, "http://agent", AgentClient(g.Slot, 0), opts, argv[0], argv[1:]...)
}

// Upload writes r to path as root (parent directories made).
func (g Guest) Upload(ctx context.Context, path string, r io.Reader) error {
	return agentclient.Upload(ctx, "http://agent", AgentClient(g.Slot, 0), g.Token, "root", path, r)
}
