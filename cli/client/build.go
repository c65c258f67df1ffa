package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// BuildRequest describes a template build (E2B's v3 template API).
type BuildRequest struct {
	Name         string
	FromImage    string
	FromTemplate string
	CPUCount     int32
	MemoryMB     int32
	StartCmd     string
	ReadyCmd     string
	Steps        []BuildStep
	Force        bool
}

// BuildStep is one build step in E2B's wire format: RUN [cmd, user?],
// ENV [k, v, ...], WORKDIR [dir], USER [user], COPY [src, dest, owner,
// mode] with FilesHash naming the uploaded archive.
type BuildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// BuildRef names a build in progress.
type BuildRef struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names,omitempty"`
}

// BuildLog is one line of a build's log.
type BuildLog struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level,omitempty"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// BuildStatus is the state of a build: building, waiting, ready or error.
type BuildStatus struct {
	Status     string     `json:"status"`
	LogEntries []BuildLog `json:"logEntries"`
	Reason     *struct {
		Message string `json:"message"`
		Step    string `json:"step,omitempty"`
	} `json:"reason,omitempty"`
}

// CreateTemplate registers a template (POST /v3/templates) and returns its
// first build, which waits for StartTemplateBuild.
func (c *Client) CreateTemplate(ctx context.Context, name string, cpuCount, memoryMB int32) (BuildRef, error) {
	req := map[string]any{"name": name}
	if cpuCount > 0 {
		req["cpuCount"] = cpuCount
	}
	if memoryMB > 0 {
		req["memoryMB"] = memoryMB
	}
	var ref BuildRef
	_, _, err := c.do(ctx, "create template "+name, "POST", "/v3/templates", req, &ref)
	return ref, err
}

// StartTemplateBuild sends the build spec of a created template's build.
func (c *Client) StartTemplateBuild(ctx context.Context, ref BuildRef, b BuildRequest) error {
	spec := map[string]any{}
	switch {
	case b.FromTemplate != "":
		spec["fromTemplate"] = b.FromTemplate
	default:
		spec["fromImage"] = b.FromImage
	}
	if b.StartCmd != "" {
		spec["startCmd"] = b.StartCmd
	}
	if b.ReadyCmd != "" {
		spec["readyCmd"] = b.ReadyCmd
	}
	if len(b.Steps) > 0 {
		spec["steps"] = b.Steps
	}
	if b.Force {
		spec["force"] = true
	}
	_, _, err := c.do(ctx, "start build "+ref.BuildID+" of template "+ref.TemplateID, "POST",
		"/v2/templates/"+url.PathEscape(ref.TemplateID)+"/builds/"+url.PathEscape(ref.BuildID), spec, nil)
	return err
}

// StartBuild registers a template and starts its build (no files to upload).
func (c *Client) StartBuild(ctx context.Context, b BuildRequest) (BuildRef, error) {
	ref, err := c.CreateTemplate(ctx, b.Name, b.CPUCount, b.MemoryMB)
	if err != nil {
		return ref, err
	}
	return ref, c.StartTemplateBuild(ctx, ref, b)
}

// BuildLogPage is how many log entries BuildStatus asks for at most; a full
// page means more may follow.
const BuildLogPage = 100

// BuildStatus returns a build's state and the log lines from logsOffset on
// (at most BuildLogPage).
func (c *Client) BuildStatus(ctx context.Context, ref BuildRef, logsOffset int) (BuildStatus, error) {
	var st BuildStatus
	path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d&limit=%d", url.PathEscape(ref.TemplateID), url.PathEscape(ref.BuildID), logsOffset, BuildLogPage)
	_, _, err := c.do(ctx, "get the status of build "+ref.BuildID+" of template "+ref.TemplateID, "GET", path, nil, &st)
	return st, err
}

// FilesLink tells whether the node already has the COPY archive with the
// given SHA-256 (hex) for a template, and where to upload it if not.
type FilesLink struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// TemplateFiles asks for a COPY archive (GET /templates/{id}/files/{hash}).
func (c *Client) TemplateFiles(ctx context.Context, templateID, hash string) (FilesLink, error) {
	var l FilesLink
	_, _, err := c.do(ctx, "look up files "+shortHash(hash)+" of template "+templateID, "GET",
		"/templates/"+url.PathEscape(templateID)+"/files/"+url.PathEscape(hash), nil, &l)
	return l, err
}

// UploadTemplateFiles PUTs a COPY archive of size bytes to link (from
// TemplateFiles; "" means this node's own upload route). The API key is sent
// only to this node's API, never to another host.
func (c *Client) UploadTemplateFiles(ctx context.Context, templateID, hash, link string, body io.Reader, size int64) error {
	op := "upload files " + shortHash(hash) + " of template " + templateID
	base, err := url.Parse(c.BaseURL + "/")
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if link == "" {
		link = "templates/" + url.PathEscape(templateID) + "/files/" + url.PathEscape(hash)
	}
	u, err := base.Parse(link)
	if err != nil {
		return fmt.Errorf("%s: upload URL %q: %w", op, link, err)
	}
	req, err := http.NewRequestWithContext(ctx, "PUT", u.String(), body)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	if u.Scheme == base.Scheme && u.Host == base.Host {
		req.Header.Set("X-API-Key", c.APIKey)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return c.transportError(op, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 300 {
		var e struct{ Message string }
		if jsonUnmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		return &APIError{Op: op, Status: resp.StatusCode, Message: e.Message}
	}
	return nil
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
