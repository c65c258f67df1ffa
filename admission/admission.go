// Package admission decides whether the node takes a create, a resume or a
// fork. It bounds what the node commits: guest memory (running sandboxes,
// the warm pool's reservations and the calls in flight, against the host's
// memory times an overcommit ratio), the number of running sandboxes, the
// free space left on the data directory's file system, and the fork
// children in flight. A refusal is an error of the node's vocabulary
// (internal/errdefs): a count limit is ErrLimit (429), a capacity limit
// ErrCapacity (503); both carry a Retry-After and name the limit and the
// numbers.
package admission

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Limits are a node's admission limits; a zero field does not limit.
type Limits struct {
	// MaxSandboxes bounds the sandboxes running or starting at once.
	MaxSandboxes int
	// MaxCommittedMiB bounds the memory committed at once: guest memory
	// plus VMMOverheadMiB per sandbox.
	MaxCommittedMiB int
	// VMMOverheadMiB is what each sandbox's VMM may use besides its
	// guest's memory (sandbox.VMMOverheadMiB of the node's accelerator),
	// counted per running or starting sandbox in the committed memory.
	VMMOverheadMiB int
	// DiskReserveBytes is the free space a call must leave on DataDir's
	// file system.
	DiskReserveBytes int64
	DataDir          string
	// MaxForkChildren bounds the fork children in flight (asked by forks
	// not yet finished).
	MaxForkChildren int
	// RetryAfter is what a refusal tells the client to wait (default 5 s).
	RetryAfter time.Duration
}

// Usage is what the node has committed outside the calls in flight: its
// running sandboxes (with a VM: running, pausing, being killed) and the
// warm pool's reservations.
type Usage struct {
	Sandboxes int
	MemoryMiB int
	PoolMiB   int
}

// Request is one call asking for admission.
type Request struct {
	// Op names the call in messages: create, resume or fork.
	Op string
	// Sandboxes and MemoryMiB are what the call starts and commits.
	Sandboxes int
	MemoryMiB int
	// ForkChildren are the children a fork asks for.
	ForkChildren int
}

// Controller admits calls against Limits. Its zero value is not usable:
// use New.
type Controller struct {
	lim     Limits
	statfs  func(dir string) (free int64, err error)
	mu      sync.Mutex
	flight  Request // the sum of the admitted calls not yet released
	holders int
}

// New returns a controller enforcing lim.
func New(lim Limits) *Controller {
	if lim.RetryAfter <= 0 {
		lim.RetryAfter = 5 * time.Second
	}
	return &Controller{lim: lim, statfs: freeBytes}
}

// Limits returns the limits c enforces.
func (c *Controller) Limits() Limits { return c.lim }

// Refusal is a refused call: the limit, the numbers, and how long to wait.
type Refusal struct {
	Limit string // the configuration key of the limit
	Msg   string
	Kind  error // errdefs.ErrLimit or errdefs.ErrCapacity
	Retry time.Duration
}

func (r *Refusal) Error() string { return r.Msg }

// Unwrap makes a refusal match its kind (errors.Is).
func (r *Refusal) Unwrap() error { return r.Kind }

// RetryAfter is how long the client should wait before retrying.
func (r *Refusal) RetryAfter() time.Duration { return r.Retry }

// Admit decides on req. usage reports the node's committed state; it is
// called with the controller's lock held, so a call that has become
// running must stay counted by usage from before it releases. On
// admission, release (idempotent) ends the call's reservation: call it
// once the call's sandboxes count in usage, or failed.
func (c *Controller) Admit(ctx context.Context, req Request, usage func() Usage) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var u Usage
	if usage != nil {
		u = usage()
	}
	if err := c.check(req, u); err != nil {
		return nil, err
	}
	c.add(req, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.add(req, -1)
			c.mu.Unlock()
		})
	}, nil
}

// InFlight reports the sum of the admitted calls not yet released, and
// how many there are.
func (c *Controller) InFlight() (Request, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flight, c.holders
}

func (c *Controller) add(req Request, sign int) {
	c.flight.Sandboxes += sign * req.Sandboxes
	c.flight.MemoryMiB += sign * req.MemoryMiB
	c.flight.ForkChildren += sign * req.ForkChildren
	c.holders += sign
}

// check (mu held) refuses req if it would cross a limit.
func (c *Controller) check(req Request, u Usage) error {
	l, f := c.lim, c.flight
	if n := req.ForkChildren; n > 0 && l.MaxForkChildren > 0 && f.ForkChildren+n > l.MaxForkChildren {
		return c.refuse("max_fork_children", errdefs.ErrLimit,
			"%s refused: %d fork children asked, %d in flight, limit %d ([admission] max_fork_children)",
			req.Op, n, f.ForkChildren, l.MaxForkChildren)
	}
	if n := req.Sandboxes; n > 0 && l.MaxSandboxes > 0 && u.Sandboxes+f.Sandboxes+n > l.MaxSandboxes {
		return c.refuse("max_sandboxes", errdefs.ErrLimit,
			"%s refused: %d sandboxes running and %d starting, limit %d ([admission] max_sandboxes)",
			req.Op, u.Sandboxes, f.Sandboxes, l.MaxSandboxes)
	}
	if m := req.MemoryMiB + req.Sandboxes*l.VMMOverheadMiB; m > 0 && l.MaxCommittedMiB > 0 {
		running := u.MemoryMiB + u.Sandboxes*l.VMMOverheadMiB
		starting := f.MemoryMiB + f.Sandboxes*l.VMMOverheadMiB
		if used := running + u.PoolMiB + starting; used+m > l.MaxCommittedMiB {
			return c.refuse("max_committed_mib", errdefs.ErrCapacity,
				"%s refused: %d MiB asked (guest memory and %d MiB for its VMM), %d MiB committed (%d running, %d warm pool, %d starting), limit %d MiB ([admission] max_committed_mib, or host memory less host_reserve_mib times memory_overcommit_pct)",
				req.Op, m, l.VMMOverheadMiB*req.Sandboxes, used, running, u.PoolMiB, starting, l.MaxCommittedMiB)
		}
	}
	if req.Sandboxes > 0 && l.DiskReserveBytes > 0 && l.DataDir != "" {
		free, err := c.statfs(l.DataDir)
		if err == nil && free < l.DiskReserveBytes {
			return c.refuse("disk_reserve_mib", errdefs.ErrCapacity,
				"%s refused: %d MiB free on %s, reserve %d MiB ([admission] disk_reserve_mib)",
				req.Op, free>>20, l.DataDir, l.DiskReserveBytes>>20)
		}
	}
	return nil
}

func (c *Controller) refuse(limit string, kind error, format string, args ...any) error {
	return &Refusal{Limit: limit, Msg: fmt.Sprintf(format, args...), Kind: kind, Retry: c.lim.RetryAfter}
}

// freeBytes is the space unprivileged writers may still use on dir's file
// system.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
