package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
)

// fpRecorded fires once a delivery is durable and before any attempt: a
// crash there must not lose it (the next start sends it).
var fpRecorded = failpoint.New("webhooks/delivery/recorded")

// Delivery is one event on its way to one webhook.
type Delivery struct {
	ID        string          `json:"id"`
	WebhookID string          `json:"webhookID"`
	Body      json.RawMessage `json:"body"`
	Attempts  int             `json:"attempts"`
	NextAt    time.Time       `json:"nextAt"`
	LastError string          `json:"lastError,omitempty"`
}

// Options tune the dispatcher (zero values take the defaults).
type Options struct {
	// MaxAttempts is how often a delivery is tried before it is dropped
	// (default 8).
	MaxAttempts int
	// Backoff is the wait after the first failure, doubled after each
	// further one up to MaxBackoff (defaults 1 s and 5 min).
	Backoff, MaxBackoff time.Duration
	// Client sends the deliveries (default: 10 s timeout).
	Client *http.Client
	Logger *slog.Logger
}

// Dispatcher holds the registrations and delivers events to them.
type Dispatcher struct {
	st   *store.Store
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	hooks    map[string]Webhook
	pending  map[string]Delivery
	attempts map[string]*attemptRing // by webhook (attempts.go)

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New loads the registrations and pending deliveries from st.
func New(st *store.Store, opts Options) (*Dispatcher, error) {
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	if opts.Backoff <= 0 {
		opts.Backoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Minute
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &Dispatcher{st: st, opts: opts, log: opts.Logger.With("component", "webhooks"),
		hooks: map[string]Webhook{}, pending: map[string]Delivery{}, attempts: map[string]*attemptRing{}, wake: make(chan struct{}, 1)}
	hooks, err := store.ListAll[Webhook](st, store.Webhooks)
	if err != nil {
		return nil, fmt.Errorf("load webhooks: %w", err)
	}
	for _, h := range hooks {
		d.hooks[h.ID] = h
	}
	dels, err := store.ListAll[Delivery](st, store.WebhookDeliveries)
	if err != nil {
		return nil, fmt.Errorf("load webhook deliveries: %w", err)
	}
	for _, dl := range dels {
		d.pending[dl.ID] = dl
	}
	return d, nil
}

// OnEvent records a delivery of ev for every webhook subscribed to its
// type (durable before it returns) and wakes the sender; it never waits
// for a receiver.
func (d *Dispatcher) OnEvent(ev sandbox.Event) {
	d.mu.Lock()
	var targets []Webhook
	for _, h := range d.hooks {
		if h.subscribed(ev.Type) {
			targets = append(targets, h)
		}
	}
	d.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	body, err := json.Marshal(newPayload(ev))
	if err != nil {
		d.log.Error("encode webhook payload", "event", ev.Type, "sandbox", ev.SandboxID, "err", err)
		return
	}
	for _, h := range targets {
		dl := Delivery{ID: newID(), WebhookID: h.ID, Body: body, NextAt: time.Now()}
		if err := d.st.Put(store.WebhookDeliveries, dl.ID, dl); err != nil {
			d.log.Error("record webhook delivery", "webhook", h.ID, "event", ev.Type, "err", err)
			continue
		}
		if err := fpRecorded.Inject(); err != nil {
			d.log.Warn("webhook delivery", "err", err)
			continue
		}
		d.mu.Lock()
		d.pending[dl.ID] = dl
		d.mu.Unlock()
	}
	d.poke()
}

func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Start runs the sender until Close.
func (d *Dispatcher) Start(ctx context.Context) {
	ctx, d.cancel = context.WithCancel(ctx)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			wait := d.sendDue(ctx)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-d.wake:
			case <-t.C:
			}
			t.Stop()
		}
	}()
}

// Close stops the sender and waits for it; pending deliveries stay
// recorded for the next start.
func (d *Dispatcher) Close() {
	if d.cancel != nil {
		d.cancel()
	}
	d.wg.Wait()
}

// sendDue attempts every delivery that is due, oldest first, and returns
// how long to wait for the next one.
func (d *Dispatcher) sendDue(ctx context.Context) time.Duration {
	now := time.Now()
	d.mu.Lock()
	var due []Delivery
	next := time.Hour
	for _, dl := range d.pending {
		if !dl.NextAt.After(now) {
			due = append(due, dl)
		} else if w := dl.NextAt.Sub(now); w < next {
			next = w
		}
	}
	d.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].NextAt.Before(due[j].NextAt) })
	for _, dl := range due {
		if ctx.Err() != nil {
			break
		}
		if again := d.attempt(ctx, dl); again > 0 && again < next {
			next = again
		}
	}
	return next
}

// attempt sends one delivery and records the outcome; the wait before its
// next attempt when it failed and may be retried, else 0.
func (d *Dispatcher) attempt(ctx context.Context, dl Delivery) time.Duration {
	d.mu.Lock()
	h, ok := d.hooks[dl.WebhookID]
	d.mu.Unlock()
	if !ok || !h.Enabled {
		d.finish(dl, "the webhook was deleted or disabled")
		return 0
	}
	status, err := d.send(ctx, h, dl)
	if err == nil {
		d.record(dl, dl.Attempts+1, status, nil, Delivered)
		d.finish(dl, "")
		return 0
	}
	if ctx.Err() != nil {
		return 0 // shutting down: the delivery stays as it was
	}
	dl.Attempts++
	dl.LastError = err.Error()
	if dl.Attempts >= d.opts.MaxAttempts {
		d.record(dl, dl.Attempts, status, err, Dropped)
		d.finish(dl, err.Error())
		return 0
	}
	d.record(dl, dl.Attempts, status, err, Retrying)
	wait := min(d.opts.Backoff<<(dl.Attempts-1), d.opts.MaxBackoff)
	dl.NextAt = time.Now().Add(wait)
	if perr := d.st.Put(store.WebhookDeliveries, dl.ID, dl); perr != nil {
		d.log.Error("record webhook retry", "delivery", dl.ID, "err", perr)
	}
	d.mu.Lock()
	if _, still := d.pending[dl.ID]; still {
		d.pending[dl.ID] = dl
	}
	d.mu.Unlock()
	d.log.Info("webhook delivery failed; retrying", "webhook", h.ID, "delivery", dl.ID, "attempt", dl.Attempts, "in", wait, "err", err)
	return wait
}

// finish forgets a delivery: sent, or given up on (why says why).
func (d *Dispatcher) finish(dl Delivery, why string) {
	if err := d.st.Delete(store.WebhookDeliveries, dl.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		d.log.Error("forget webhook delivery", "delivery", dl.ID, "err", err)
	}
	d.mu.Lock()
	delete(d.pending, dl.ID)
	d.mu.Unlock()
	if why != "" {
		d.log.Warn("webhook delivery dropped", "webhook", dl.WebhookID, "delivery", dl.ID, "attempts", dl.Attempts, "why", why)
	}
}

// send POSTs the delivery's body with E2B's headers and returns the
// receiver's status (0 without an answer); a non-2xx answer is an error.
func (d *Dispatcher) send(ctx context.Context, h Webhook, dl Delivery) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(dl.Body))
	if err != nil {
		return 0, fmt.Errorf("webhook %s: %w", h.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("e2b-webhook-id", h.ID)
	req.Header.Set("e2b-delivery-id", newID())
	req.Header.Set("e2b-signature-version", "v1")
	req.Header.Set("e2b-signature", Sign(h.Secret, dl.Body))
	resp, err := d.opts.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("webhook %s: %w", h.ID, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("webhook %s: receiver answered %s", h.ID, resp.Status)
	}
	return resp.StatusCode, nil
}

// Pending is how many deliveries wait to be sent.
func (d *Dispatcher) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending)
}
