package warmpool

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/agentenv/agentenv/store"
)

// idleWait is how long the refill sleeps with nothing to do and no wake-up.
const idleWait = time.Minute

// maxBackoff bounds the wait after a key's failed fills.
const maxBackoff = time.Minute

// maxYield bounds how long the refill yields to the creates that took
// entries: a VMM's start is CPU work that a guest waking up (the create's
// agent stage) competes for, but a stream of creates must not starve the
// pool.
const maxYield = 5 * time.Second

// run fills one entry at a time while a key is due, until ctx ends.
func (p *Pool) run(ctx context.Context) {
	for {
		key, memMiB, wait := p.next(time.Now())
		if key != "" {
			p.fill(ctx, key, memMiB)
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// next returns the key to fill an entry of now ("" when none), else how
// long to wait at most before looking again. A key below Low fills until
// High; a fill never takes the entries past ReserveMiB, nor starts while a
// create that took an entry runs (for maxYield at most).
func (p *Pool) next(now time.Time) (key string, memMiB int, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	wait = idleWait
	if p.closed || p.starting > 0 {
		return "", 0, wait
	}
	if yield := p.yieldLocked(now); yield > 0 {
		return "", 0, yield // Done wakes the refill earlier
	}
	names := make([]string, 0, len(p.keys))
	for k := range p.keys {
		names = append(names, k)
	}
	sort.Strings(names) // every key gets its turn in the same order
	for _, k := range names {
		ks := p.keys[k]
		n := len(ks.ready)
		if n < p.opts.Low {
			ks.filling = true
		}
		if n >= p.opts.High {
			ks.filling = false
		}
		switch {
		case !ks.filling:
		case now.Before(ks.retryAt):
			wait = min(wait, ks.retryAt.Sub(now))
		case p.reservedLocked()+ks.memMiB > p.opts.ReserveMiB:
			// Full: a take or a drop frees room and wakes the refill.
		default:
			return k, ks.memMiB, 0
		}
	}
	return "", 0, wait
}

// yieldLocked is how long the refill still yields to the creates that took
// entries (0: it does not); mu held.
func (p *Pool) yieldLocked(now time.Time) time.Duration {
	var d time.Duration
	for _, at := range p.taken {
		d = max(d, at.Add(maxYield).Sub(now))
	}
	return d
}

// fill makes one entry of key: recorded as starting, its VM started (pid,
// slot and device recorded as soon as the VMM runs), recorded ready, then
// handed to takers. A failure leaves nothing (the record goes last) and
// delays the key's next fill.
func (p *Pool) fill(ctx context.Context, key string, memMiB int) {
	p.mu.Lock()
	p.starting++
	p.startingMiB += memMiB
	p.mu.Unlock()
	start := time.Now()
	e, err := p.make(ctx, key, memMiB)
	p.mu.Lock()
	p.starting--
	p.startingMiB -= memMiB
	ks := p.keys[key]
	keep := err == nil && ks != nil && !p.closed
	if keep {
		ks.ready = append(ks.ready, e)
		ks.failures, ks.retryAt = 0, time.Time{}
	} else if err != nil && ks != nil {
		ks.failures++
		ks.retryAt = time.Now().Add(backoff(ks.failures))
	}
	p.mu.Unlock()
	switch {
	case err != nil && ctx.Err() == nil:
		p.log.Warn("warm pool: fill failed", "key", key, "err", err)
	case err == nil && keep:
		p.log.Info("warm pool: entry ready", "key", key, "entry", e.ID, "pid", e.PID, "slot", e.Slot,
			"took", time.Since(start).Round(time.Millisecond))
	case err == nil:
		p.discard(ctx, e) // its key was dropped, or the pool closed, meanwhile
	}
}

// backoff is the wait after n failed fills in a row: 1 s doubling up to
// maxBackoff.
func backoff(n int) time.Duration {
	d := time.Second << min(n-1, 6)
	return min(d, maxBackoff)
}

// make records, starts and readies one entry.
func (p *Pool) make(ctx context.Context, key string, memMiB int) (*Entry, error) {
	rec, err := p.newRecord(key, memMiB)
	if err != nil {
		return nil, err
	}
	if err := p.put(rec); err != nil {
		return nil, err
	}
	fail := func(err error) (*Entry, error) {
		p.forget(rec.ID)
		return nil, err
	}
	if err := fpFillRecorded.Inject(); err != nil {
		return fail(err)
	}
	vm, err := p.opts.Filler.Fill(ctx, &rec, func() error {
		if err := p.put(rec); err != nil {
			return err
		}
		return fpFillStarted.Inject()
	})
	if err != nil {
		return fail(fmt.Errorf("pool entry %s of %s: %w", rec.ID, key, err))
	}
	e := &Entry{Record: rec, VM: vm}
	e.State = Ready
	if err := p.put(e.Record); err == nil {
		err = fpFillReady.Inject()
	}
	if err != nil {
		p.opts.Filler.Drain(context.WithoutCancel(ctx), e)
		return fail(err)
	}
	return e, nil
}

func (p *Pool) put(r Record) error {
	if err := p.opts.Store.Put(store.VMMPool, r.ID, r); err != nil {
		return fmt.Errorf("record pool entry %s (%s): %w", r.ID, r.State, err)
	}
	return nil
}

// forget removes the record of an entry that holds nothing any more.
func (p *Pool) forget(id string) {
	if err := p.opts.Store.Delete(store.VMMPool, id); err != nil {
		p.log.Warn("remove the record of a failed pool entry (removed at the next start)", "entry", id, "err", err)
	}
}
