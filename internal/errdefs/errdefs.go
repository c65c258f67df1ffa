// Package errdefs is the node's one error vocabulary: the kinds of failure
// a client can act on. The packages that serve the API (orchestrator,
// template, snapshot) wrap their errors into these, and the API maps each
// to one HTTP status; anything else is an internal failure (500).
package errdefs

import "errors"

var (
	// ErrNotFound: the named sandbox, template, snapshot or build does not exist (404).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the object is in a state that forbids the call (409).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the request itself is wrong (400).
	ErrInvalid = errors.New("invalid request")
	// ErrCapacity: the node cannot take the request now (no network slot,
	// no storage device, not enough free memory); retry later or elsewhere
	// (503 with Retry-After).
	ErrCapacity = errors.New("node at capacity")
	// ErrLimit: the call would cross one of the node's count limits
	// (sandboxes running, fork children in flight); retry later (429 with
	// Retry-After).
	ErrLimit = errors.New("node limit reached")
)
