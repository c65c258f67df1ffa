// Package webhooks owns the node's lifecycle webhooks in E2B's format: the
// registrations (/events/webhooks), the payload of each sandbox lifecycle
// event, its signature (e2b-signature: unpadded base64 of SHA-256 over the
// secret followed by the raw body) and its delivery, retried with
// exponential backoff. Registrations and pending deliveries live in the
// node's store, so a restart resumes the deliveries it had not finished.
package webhooks

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/agentenv/agentenv/sandbox"
)

// Events are the event types a webhook may subscribe to.
var Events = []string{sandbox.EventCreated, sandbox.EventKilled, sandbox.EventPaused,
	sandbox.EventResumed, sandbox.EventForked}

// neverSent are event types E2B has that this node accepts in a
// subscription (so E2B's examples register as they are) but never sends:
// it has no configuration updates or checkpoints as events of their own.
var neverSent = []string{"sandbox.lifecycle.updated", "sandbox.lifecycle.checkpointed"}

// Webhook is one registration.
type Webhook struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Enabled   bool      `json:"enabled"`
	Events    []string  `json:"events"`
	Secret    string    `json:"signatureSecret"`
	CreatedAt time.Time `json:"createdAt"`
}

// ErrInvalid marks a registration that cannot be stored; ErrNotFound an
// unknown webhook id.
var (
	ErrInvalid  = errors.New("invalid webhook")
	ErrNotFound = errors.New("webhook not found")
)

// Limits of a registration: what one may hold, not what E2B documents.
const (
	maxNameLen   = 256
	maxURLLen    = 2048
	maxSecretLen = 1024
	maxWebhooks  = 100
)

// validate checks a registration (URL, events, sizes).
func (w Webhook) validate() error {
	if len(w.Name) > maxNameLen || len(w.Secret) > maxSecretLen || len(w.URL) > maxURLLen {
		return fmt.Errorf("%w: name, url or signatureSecret too long", ErrInvalid)
	}
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: url %q is not an http(s) URL", ErrInvalid, w.URL)
	}
	if len(w.Events) == 0 {
		return fmt.Errorf("%w: events must name at least one of %v", ErrInvalid, Events)
	}
	for _, e := range w.Events {
		if !slices.Contains(Events, e) && !slices.Contains(neverSent, e) {
			return fmt.Errorf("%w: unknown event %q (known: %v)", ErrInvalid, e, Events)
		}
	}
	return nil
}

// subscribed reports whether w takes events of type typ now.
func (w Webhook) subscribed(typ string) bool {
	return w.Enabled && slices.Contains(w.Events, typ)
}

// Sign is the e2b-signature of body under secret.
func Sign(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// payload is E2B's webhook body (version v2 of its event format).
type payload struct {
	Version            string    `json:"version"`
	ID                 string    `json:"id"`
	Type               string    `json:"type"`
	EventData          eventData `json:"eventData"`
	SandboxBuildID     string    `json:"sandboxBuildId"`
	SandboxExecutionID string    `json:"sandboxExecutionId"`
	SandboxID          string    `json:"sandboxId"`
	SandboxTeamID      string    `json:"sandboxTeamId"`
	SandboxTemplateID  string    `json:"sandboxTemplateId"`
	Timestamp          time.Time `json:"timestamp"`
}

type eventData struct {
	SandboxMetadata map[string]string `json:"sandbox_metadata,omitempty"`
	Execution       *execution        `json:"execution,omitempty"`
}

// execution is on killed and paused events, as in E2B's.
type execution struct {
	StartedAt     time.Time `json:"started_at"`
	VCPUCount     int       `json:"vcpu_count"`
	MemoryMB      int       `json:"memory_mb"`
	ExecutionTime int64     `json:"execution_time"` // milliseconds
}

// TeamID is what the node reports as sandboxTeamId: one node, one team.
const TeamID = "aenvd"

// newPayload maps an orchestrator event onto E2B's payload.
func newPayload(ev sandbox.Event) payload {
	p := payload{Version: "v2", ID: newID(), Type: ev.Type, SandboxID: ev.SandboxID, SandboxTeamID: TeamID,
		SandboxTemplateID: ev.TemplateID, SandboxBuildID: ev.TemplateID,
		SandboxExecutionID: ExecutionID(ev),
		Timestamp:          ev.Time.UTC(), EventData: eventData{SandboxMetadata: ev.Metadata}}
	if ev.Type == sandbox.EventKilled || ev.Type == sandbox.EventPaused {
		p.EventData.Execution = &execution{StartedAt: ev.StartedAt.UTC(), VCPUCount: ev.VCPUs, MemoryMB: ev.MemoryMiB,
			ExecutionTime: max(0, ev.Time.Sub(ev.StartedAt).Milliseconds())}
	}
	return p
}

// ExecutionID names the run of the sandbox an event is of (E2B's
// sandboxExecutionId): its id and the time the run started.
func ExecutionID(ev sandbox.Event) string {
	return ev.SandboxID + "-" + ev.StartedAt.UTC().Format("20060102T150405Z")
}

// newID is a random 128-bit id in hex.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
