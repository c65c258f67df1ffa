// Package warmpool keeps VMs started ahead of the creates that take them:
// a warm pool of VMM processes per key (a template), each entry a VMM
// waiting for its state (sandbox.Spec.Prepare) with a network slot, a disk
// and a control group of its own, confined like any VMM. A create from the
// key takes an entry (Take) and loads its state into it (sandbox.Spec.Pooled):
// what it saves is the VMM's start, the slot's and the disk's.
//
// The watermarks are per key: below Low entries (ready or starting) a
// refill starts and goes on until High. Every entry counts its guest's
// memory against ReserveMiB, which no fill exceeds. One goroutine refills,
// one entry at a time (a VMM's start is CPU work the node's creates compete
// for); Start runs it and Close stops it, waits for it and drains the pool.
//
// # Durability
//
// Each entry has a record in the node's store (store.VMMPool) before it
// holds anything: "starting" is written first, then the VMM's pid, start
// time, slot and device as soon as the VMM runs, then "ready". A taker
// records in its own record what it took before the entry's record goes
// (Handed). Nothing of the pool survives a restart: Recover, at the next
// start, removes every entry its records name (the VMM, the device, the
// directory; the node's network start clears slots no sandbox keeps) and
// the records, and the refill starts anew. Fault points sit between the
// steps (warmpool/...), crashed by api/e2e's crash matrix.
package warmpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
)

// Entry states.
const (
	Starting = "starting" // recorded before anything is acquired
	Ready    = "ready"    // the VMM waits for a state
)

// IDPrefix begins every entry's id (its VM's and control group's name).
const IDPrefix = "pool-"

// Fault points between the durable steps of a fill and a hand-off.
var (
	fpFillRecorded = failpoint.New("warmpool/fill/recorded") // "starting" is durable, nothing acquired
	fpFillStarted  = failpoint.New("warmpool/fill/started")  // the VMM runs; its pid, slot and device are recorded
	fpFillReady    = failpoint.New("warmpool/fill/ready")    // "ready" is durable
	fpHanded       = failpoint.New("warmpool/handed")        // the entry's record is gone: its VM is the taker's
)

// Record is an entry as the store keeps it.
type Record struct {
	ID        string `json:"id"`
	Key       string `json:"key"` // what the VM restores (a template id)
	State     string `json:"state"`
	Dir       string `json:"dir"` // the entry's own directory (its VM's run directory inside)
	MemoryMiB int    `json:"memoryMiB"`
	// PID and PIDStart name the VMM process (its start time guards
	// against a reused pid); Slot and Device what it holds.
	PID       int       `json:"pid,omitempty"`
	PIDStart  uint64    `json:"pidStart,omitempty"`
	Slot      int       `json:"slot,omitempty"`
	Device    uint32    `json:"device,omitempty"`
	HasDevice bool      `json:"hasDevice,omitempty"`
	Created   time.Time `json:"created"`
}

// Entry is a ready VM of the pool.
type Entry struct {
	Record
	VM *sandbox.VM
}

// Filler makes and removes the entries' VMs (the orchestrator).
type Filler interface {
	// Fill starts the VM of rec, recorded as starting, and fills in rec's
	// pid, slot and device, calling started as soon as its VMM runs (an
	// error from it fails the fill). On failure nothing it started is left.
	Fill(ctx context.Context, rec *Record, started func() error) (*sandbox.VM, error)
	// Drain stops an entry's VM and releases what it holds.
	Drain(ctx context.Context, e *Entry)
}

// Options configure a pool.
type Options struct {
	Store  *store.Store
	Filler Filler
	// Dir holds the entries' directories (Dir/<id>).
	Dir string
	// Low and High are the watermarks per key; ReserveMiB bounds the guest
	// memory of all entries together.
	Low, High, ReserveMiB int
	Logger                *slog.Logger
}

// Pool is the warm pool.
type Pool struct {
	opts   Options
	log    *slog.Logger
	wake   chan struct{} // a refill may be due
	cancel context.CancelFunc
	done   chan struct{} // closed when the refill goroutine ended

	mu          sync.Mutex // guards the fields below
	keys        map[string]*keyState
	starting    int // entries being filled (one at most)
	startingMiB int
	closed      bool
	hits, miss  int64
	// taken are the entries whose takers' creates are still running, by
	// id, with when they were taken: the refill yields to them (refill.go).
	taken map[string]time.Time
}

// keyState is one key's part of the pool.
type keyState struct {
	memMiB   int
	ready    []*Entry  // oldest first
	filling  bool      // went below Low: refilling up to High
	retryAt  time.Time // after failed fills, not before
	failures int
}

// New returns a pool that fills nothing until Start and Want.
func New(opts Options) *Pool {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Pool{opts: opts, log: opts.Logger.With("component", "warmpool"), wake: make(chan struct{}, 1),
		keys: map[string]*keyState{}, taken: map[string]time.Time{}}
}

// Start runs the refill in a goroutine of the pool's own (Close ends it).
func (p *Pool) Start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.done = make(chan struct{})
	go func() {
		defer close(p.done)
		p.run(ctx)
	}()
	p.log.Info("warm pool of VMM processes", "low", p.opts.Low, "high", p.opts.High, "reserve_mib", p.opts.ReserveMiB)
}

// Close stops the refill, waits for it (a fill in progress is cancelled and
// undone) and drains every entry.
func (p *Pool) Close(ctx context.Context) {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	p.mu.Lock()
	p.closed = true
	var all []*Entry
	for _, ks := range p.keys {
		all = append(all, ks.ready...)
		ks.ready = nil
	}
	p.mu.Unlock()
	for _, e := range all {
		p.discard(ctx, e)
	}
}

// Want keeps key's entries filled; each entry's guest has memMiB.
func (p *Pool) Want(key string, memMiB int) {
	p.mu.Lock()
	if p.keys[key] == nil && !p.closed {
		p.keys[key] = &keyState{memMiB: memMiB}
	}
	p.mu.Unlock()
	p.poke()
}

// Drop stops keeping key (its template goes) and drains its entries; a
// fill of it in progress is drained when it ends.
func (p *Pool) Drop(ctx context.Context, key string) {
	p.mu.Lock()
	ks := p.keys[key]
	delete(p.keys, key)
	p.mu.Unlock()
	if ks == nil {
		return
	}
	for _, e := range ks.ready {
		p.discard(ctx, e)
	}
}

// Take hands out key's oldest ready entry (nil when none is ready). Its
// record stays until Handed or Discard: the taker records first what it
// took. The taker calls Done once its create is over.
func (p *Pool) Take(key string) *Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	ks := p.keys[key]
	if ks == nil || len(ks.ready) == 0 {
		if ks != nil {
			p.miss++
		}
		return nil
	}
	e := ks.ready[0]
	ks.ready = ks.ready[1:]
	p.hits++
	p.taken[e.ID] = time.Now()
	p.poke()
	return e
}

// Done says the create that took e is over (its guest runs, or it failed):
// the refill no longer yields to it.
func (p *Pool) Done(e *Entry) {
	p.mu.Lock()
	delete(p.taken, e.ID)
	p.mu.Unlock()
	p.poke()
}

// Handed removes a taken entry's record: its VM is the taker's now, and
// the taker's record names what it holds.
func (p *Pool) Handed(e *Entry) error {
	if err := p.opts.Store.Delete(store.VMMPool, e.ID); err != nil {
		return fmt.Errorf("hand over pool entry %s: %w", e.ID, err)
	}
	return fpHanded.Inject()
}

// Discard drains a taken entry the taker does not use, and its record.
func (p *Pool) Discard(ctx context.Context, e *Entry) { p.discard(ctx, e) }

func (p *Pool) discard(ctx context.Context, e *Entry) {
	p.opts.Filler.Drain(context.WithoutCancel(ctx), e)
	if err := p.opts.Store.Delete(store.VMMPool, e.ID); err != nil {
		p.log.Warn("remove the record of a drained pool entry (removed at the next start)", "entry", e.ID, "err", err)
	}
}

// Stats is the pool's size.
type Stats struct {
	Ready, Starting int
	ReadyByKey      map[string]int
	ReservedMiB     int // guest memory of the entries, ready and starting
	Low, High       int
	ReserveMiB      int
	Hits, Misses    int64 // takes that found an entry, and that found none
}

// Stats reports the pool's size.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Starting: p.starting, ReservedMiB: p.reservedLocked(), Low: p.opts.Low, High: p.opts.High,
		ReserveMiB: p.opts.ReserveMiB, Hits: p.hits, Misses: p.miss, ReadyByKey: map[string]int{}}
	for k, ks := range p.keys {
		st.Ready += len(ks.ready)
		st.ReadyByKey[k] = len(ks.ready)
	}
	return st
}

// reservedLocked is the guest memory the entries hold (mu held).
func (p *Pool) reservedLocked() int {
	n := p.startingMiB
	for _, ks := range p.keys {
		n += len(ks.ready) * ks.memMiB
	}
	return n
}

// poke wakes the refill without blocking.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Recover removes what a previous process's pool left (at startup, before
// the node's network starts): each recorded entry through remove (its VMM,
// device and directory), then its record, then whatever else lies in dir.
func Recover(ctx context.Context, st *store.Store, dir string, remove func(context.Context, Record), log *slog.Logger) error {
	recs, err := store.ListAll[Record](st, store.VMMPool)
	if err != nil {
		return fmt.Errorf("recover the warm pool: %w", err)
	}
	for _, r := range recs {
		remove(ctx, r)
		if err := st.Delete(store.VMMPool, r.ID); err != nil {
			return fmt.Errorf("recover the warm pool: entry %s: %w", r.ID, err)
		}
		log.Info("removed a warm pool entry a previous process left", "entry", r.ID, "state", r.State, "pid", r.PID, "slot", r.Slot)
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("recover the warm pool: %w", err)
	}
	return nil
}

// newRecord is a fresh entry of key in state starting.
func (p *Pool) newRecord(key string, memMiB int) (Record, error) {
	id, err := ids.New()
	if err != nil {
		return Record{}, err
	}
	id = IDPrefix + id
	return Record{ID: id, Key: key, State: Starting, Dir: filepath.Join(p.opts.Dir, id), MemoryMiB: memMiB,
		Created: time.Now().UTC()}, nil
}
