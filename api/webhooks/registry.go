package webhooks

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/agentenv/agentenv/store"
)

// Patch is a partial update of a registration (nil fields are kept).
type Patch struct {
	Name    *string
	URL     *string
	Enabled *bool
	Events  *[]string
	Secret  *string
}

// Create stores a new registration (ID and CreatedAt assigned).
func (d *Dispatcher) Create(w Webhook) (Webhook, error) {
	w.ID, w.CreatedAt = newID(), time.Now().UTC()
	w.Events = slices.Compact(slices.Sorted(slices.Values(w.Events)))
	if err := w.validate(); err != nil {
		return Webhook{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.hooks) >= maxWebhooks {
		return Webhook{}, fmt.Errorf("%w: the node holds at most %d webhooks", ErrInvalid, maxWebhooks)
	}
	if err := d.st.Put(store.Webhooks, w.ID, w); err != nil {
		return Webhook{}, fmt.Errorf("store webhook %s: %w", w.ID, err)
	}
	d.hooks[w.ID] = w
	return w, nil
}

// List returns the registrations, oldest first.
func (d *Dispatcher) List() []Webhook {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Webhook, 0, len(d.hooks))
	for _, h := range d.hooks {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// Get returns one registration.
func (d *Dispatcher) Get(id string) (Webhook, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.hooks[id]
	if !ok {
		return Webhook{}, fmt.Errorf("webhook %q: %w", id, ErrNotFound)
	}
	return h, nil
}

// Update applies p to a registration.
func (d *Dispatcher) Update(id string, p Patch) (Webhook, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.hooks[id]
	if !ok {
		return Webhook{}, fmt.Errorf("webhook %q: %w", id, ErrNotFound)
	}
	if p.Name != nil {
		h.Name = *p.Name
	}
	if p.URL != nil {
		h.URL = *p.URL
	}
	if p.Enabled != nil {
		h.Enabled = *p.Enabled
	}
	if p.Events != nil {
		h.Events = slices.Compact(slices.Sorted(slices.Values(*p.Events)))
	}
	if p.Secret != nil {
		h.Secret = *p.Secret
	}
	if err := h.validate(); err != nil {
		return Webhook{}, err
	}
	if err := d.st.Put(store.Webhooks, h.ID, h); err != nil {
		return Webhook{}, fmt.Errorf("store webhook %s: %w", h.ID, err)
	}
	d.hooks[id] = h
	return h, nil
}

// Delete removes a registration; its pending deliveries are dropped when
// next due.
func (d *Dispatcher) Delete(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.hooks[id]; !ok {
		return fmt.Errorf("webhook %q: %w", id, ErrNotFound)
	}
	if err := d.st.Delete(store.Webhooks, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete webhook %s: %w", id, err)
	}
	delete(d.hooks, id)
	delete(d.attempts, id)
	return nil
}
