package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
)

// GuestMetrics is one sample of the agent's /metrics.
type GuestMetrics struct {
	TS         int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   int64   `json:"mem_total"`
	MemUsed    int64   `json:"mem_used"`
	DiskUsed   int64   `json:"disk_used"`
	DiskTotal  int64   `json:"disk_total"`
}

// maxAgentLogs bounds what GET /logs of an agent may answer (its ring
// holds at most 1000 lines of 4 KiB).
const maxAgentLogs = 5 << 20

// askAgent sends GET path to the agent of sandbox id in slot (token: its
// access token, "" for none).
func askAgent(ctx context.Context, slot *network.Slot, token, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	return sandbox.AgentClient(slot, 10*time.Second).Do(req)
}

// Metrics samples the agent of sandbox id, running in slot.
func Metrics(ctx context.Context, id string, slot *network.Slot, token string) (*GuestMetrics, error) {
	resp, err := askAgent(ctx, slot, token, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s metrics: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("sandbox %s metrics: agent answered %s: %s", id, resp.Status, msg)
	}
	var m GuestMetrics
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&m); err != nil {
		return nil, fmt.Errorf("sandbox %s metrics: %w", id, err)
	}
	return &m, nil
}

// AgentLogs returns the recent log lines of the agent of sandbox id,
// running in slot (GET /logs); nil from an agent without /logs.
func AgentLogs(ctx context.Context, id string, slot *network.Slot, token string) ([]byte, error) {
	resp, err := askAgent(ctx, slot, token, "/logs")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s logs: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil // an agent without /logs
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sandbox %s logs: agent answered %s", id, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAgentLogs))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s logs: %w", id, err)
	}
	return b, nil
}
