package orchestrator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/sandbox"
)

// ConsoleLog returns the path of a sandbox's guest console log (the
// kernel's and the guest agent's lines) while its VM runs, "" while it has
// none (paused: the console goes with the stopped VM).
func (o *Orchestrator) ConsoleLog(id string) (string, error) {
	s, err := o.lookup(id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil || s.vm.Machine == nil {
		return "", nil
	}
	return s.vm.Machine.Info().ConsoleLog, nil
}

// maxAgentLogs bounds what GET /logs of an agent may answer (its ring
// holds at most 1000 lines of 4 KiB).
const maxAgentLogs = 5 << 20

// AgentLogs returns a running sandbox's agent's recent log lines (GET
// /logs of the agent), nil for a sandbox that does not run.
func (o *Orchestrator) AgentLogs(ctx context.Context, id string) ([]byte, error) {
	rec, err := o.Get(id)
	if err != nil {
		return nil, err
	}
	if rec.State != sandbox.Running {
		return nil, nil
	}
	slot, _, err := o.Slot(id)
	if err != nil {
		return nil, nil
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/logs", nil)
	if rec.AccessToken != "" {
		req.Header.Set("X-Access-Token", rec.AccessToken)
	}
	resp, err := sandbox.AgentClient(slot, 10*time.Second).Do(req)
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
