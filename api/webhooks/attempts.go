package webhooks

import (
	"encoding/json"
	"fmt"
	"time"
)

// keptAttempts is how many recent attempts the dispatcher keeps per
// webhook (in memory: GET /events/webhooks/{id}/deliveries).
const keptAttempts = 50

// Outcomes of an attempt.
const (
	Delivered = "delivered" // the receiver answered 2xx
	Retrying  = "retrying"  // failed; tried again later
	Dropped   = "dropped"   // failed the last allowed time
)

// Attempt is one try to deliver an event to a webhook.
type Attempt struct {
	DeliveryID string
	WebhookID  string
	Event      string // the event type
	SandboxID  string
	Time       time.Time // when the attempt ended
	Number     int       // 1 for the first try
	StatusCode int       // 0 when the receiver did not answer
	Error      string
	Outcome    string
}

// attemptRing holds a webhook's last attempts in arrival order.
type attemptRing struct {
	buf   []Attempt
	start int
}

func (r *attemptRing) push(a Attempt) {
	if len(r.buf) < keptAttempts {
		r.buf = append(r.buf, a)
		return
	}
	r.buf[r.start] = a
	r.start = (r.start + 1) % keptAttempts
}

// newestFirst returns a copy of the ring, newest first.
func (r *attemptRing) newestFirst() []Attempt {
	out := make([]Attempt, 0, len(r.buf))
	for i := len(r.buf) - 1; i >= 0; i-- {
		out = append(out, r.buf[(r.start+i)%len(r.buf)])
	}
	return out
}

// record keeps an attempt of dl (status and err its result; outcome one
// of Delivered, Retrying, Dropped).
func (d *Dispatcher) record(dl Delivery, number, status int, err error, outcome string) {
	var head struct {
		Type      string `json:"type"`
		SandboxID string `json:"sandboxId"`
	}
	_ = json.Unmarshal(dl.Body, &head) // the node wrote it: a payload
	a := Attempt{DeliveryID: dl.ID, WebhookID: dl.WebhookID, Event: head.Type, SandboxID: head.SandboxID,
		Time: time.Now().UTC(), Number: number, StatusCode: status, Outcome: outcome}
	if err != nil {
		a.Error = err.Error()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.hooks[dl.WebhookID]; !ok {
		return // deleted meanwhile: nothing to keep it for
	}
	r := d.attempts[dl.WebhookID]
	if r == nil {
		r = &attemptRing{}
		d.attempts[dl.WebhookID] = r
	}
	r.push(a)
}

// Attempts returns the webhook's last attempts, newest first.
func (d *Dispatcher) Attempts(id string) ([]Attempt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.hooks[id]; !ok {
		return nil, fmt.Errorf("webhook %q: %w", id, ErrNotFound)
	}
	r := d.attempts[id]
	if r == nil {
		return []Attempt{}, nil
	}
	return r.newestFirst(), nil
}
