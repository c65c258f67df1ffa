// Package store persists aenvd's node state (sandboxes, templates,
// snapshots) in an embedded bbolt database: one bucket per kind, JSON
// values keyed by id. Every write is one transaction, durable on return.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Kinds of records, one bucket each.
const (
	Sandboxes = "sandboxes"
	Templates = "templates"
	Snapshots = "snapshots"
	// TemplateAttrs are the API's attributes of templates (public, tags).
	TemplateAttrs = "templateAttrs"
	// Webhooks and WebhookDeliveries are the lifecycle webhooks and their
	// pending deliveries.
	Webhooks          = "webhooks"
	WebhookDeliveries = "webhookDeliveries"
	// VMMPool are the entries of the warm pool of VMM processes
	// (package warmpool): each names the VMM, slot and device it holds.
	VMMPool = "vmmPool"
)

// ErrNotFound is returned by Get for a missing key.
var ErrNotFound = errors.New("store: not found")

// Store is an open database.
type Store struct{ db *bolt.DB }

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{Sandboxes, Templates, Snapshots, TemplateAttrs, Webhooks, WebhookDeliveries, VMMPool} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: create buckets: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Put stores v as JSON under kind/id.
func (s *Store) Put(kind, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store put %s/%s: %w", kind, id, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(kind))
		if bk == nil {
			return fmt.Errorf("no bucket %q", kind)
		}
		return bk.Put([]byte(id), b)
	})
	if err != nil {
		return fmt.Errorf("store put %s/%s: %w", kind, id, err)
	}
	return nil
}

// Get decodes kind/id into v; ErrNotFound when absent.
func (s *Store) Get(kind, id string, v any) error {
	return s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(kind))
		if bk == nil {
			return fmt.Errorf("store get %s/%s: no bucket", kind, id)
		}
		b := bk.Get([]byte(id))
		if b == nil {
			return fmt.Errorf("store get %s/%s: %w", kind, id, ErrNotFound)
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("store get %s/%s: %w", kind, id, err)
		}
		return nil
	})
}

// Delete removes kind/id; deleting a missing key is not an error.
func (s *Store) Delete(kind, id string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(kind))
		if bk == nil {
			return fmt.Errorf("no bucket %q", kind)
		}
		return bk.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("store delete %s/%s: %w", kind, id, err)
	}
	return nil
}

// List calls fn with every id and raw JSON value of kind, in key order.
func (s *Store) List(kind string, fn func(id string, raw []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(kind))
		if bk == nil {
			return fmt.Errorf("store list %s: no bucket", kind)
		}
		return bk.ForEach(func(k, v []byte) error { return fn(string(k), v) })
	})
}

// ListAll decodes every record of kind into a fresh T.
func ListAll[T any](s *Store, kind string) ([]T, error) {
	var out []T
	err := s.List(kind, func(id string, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("store list %s: %s: %w", kind, id, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}
