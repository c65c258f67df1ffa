package agentclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// Upload writes r to path in the guest as user through the agent's
// /files at baseURL (token: the agent's access token, "" for none). The
// body streams: r may be a file of any size or a pipe.
func Upload(ctx context.Context, baseURL string, hc *http.Client, token, user, path string, r io.Reader) error {
	if hc == nil {
		hc = http.DefaultClient
	}
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/files?"+q.Encode(), r)
	if err != nil {
		return fmt.Errorf("upload %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("upload %s via %s: %w", path, baseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("upload %s: agent answered %s: %s", path, resp.Status, msg)
	}
	return nil
}
