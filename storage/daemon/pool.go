package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// shape is what makes two writable runtime devices interchangeable before
// first use: the image they stack on and the requested size.
type shape struct {
	image string
	size  int64
}

func shapeOf(r *record) shape { return shape{image: r.Image, size: r.ReqSize} }

// poolShape is the warm pool of one shape.
type poolShape struct {
	low, high int
	explicit  bool // set by a warm call (persisted), not just the defaults
	ready     []uint32
	filling   bool
}

// warmPool keeps ready, exported writable devices per image shape, so create
// only renames a pool device to the caller's. Refill runs in the background
// when a shape drops below its low watermark and stops at the high one.
type warmPool struct {
	d      *Daemon
	mu     sync.Mutex
	shapes map[shape]*poolShape
}

func newWarmPool(d *Daemon) *warmPool { return &warmPool{d: d, shapes: make(map[shape]*poolShape)} }

// get returns the shape's pool, registering it with the daemon's default
// watermarks. Caller holds p.mu.
func (p *warmPool) get(s shape) *poolShape {
	ps, ok := p.shapes[s]
	if !ok {
		ps = &poolShape{low: p.d.opts.PoolLow, high: p.d.opts.PoolHigh}
		p.shapes[s] = ps
	}
	return ps
}

// take pops a ready device id of the shape.
func (p *warmPool) take(s shape) (uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.shapes[s]
	if !ok || len(ps.ready) == 0 {
		return 0, false
	}
	id := ps.ready[0]
	ps.ready = ps.ready[1:]
	return id, true
}

// touch registers a shape seen by create and refills it.
func (p *warmPool) touch(s shape) {
	p.mu.Lock()
	p.get(s)
	p.mu.Unlock()
	p.refill(s)
}

// configure sets a shape's watermarks, and refills it if asked (warm
// refills only once the watermarks are saved).
func (p *warmPool) configure(s shape, low, high int, refill bool) {
	p.mu.Lock()
	ps := p.get(s)
	if low > 0 || high > 0 {
		ps.low, ps.high = low, max(low, high)
		ps.explicit = true
	}
	p.mu.Unlock()
	if refill {
		p.refill(s)
	}
}

// poolShapeRecord is one explicitly configured shape in STATE/pool.json, so
// a restarted daemon keeps its watermarks.
type poolShapeRecord struct {
	Image string `json:"image"`
	Size  int64  `json:"size,omitempty"`
	Low   int    `json:"low"`
	High  int    `json:"high"`
}

func (p *warmPool) records() []poolShapeRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []poolShapeRecord
	for s, ps := range p.shapes {
		if ps.explicit {
			out = append(out, poolShapeRecord{Image: s.image, Size: s.size, Low: ps.low, High: ps.high})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Image != out[j].Image {
			return out[i].Image < out[j].Image
		}
		return out[i].Size < out[j].Size
	})
	return out
}

func (d *Daemon) poolFile() string { return filepath.Join(d.opts.StateDir, "pool.json") }

// savePool writes the configured shapes atomically.
func (d *Daemon) savePool() error {
	b, err := json.MarshalIndent(d.pool.records(), "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(d.poolFile(), b, 0o600); err != nil {
		return fmt.Errorf("save warm pool config: %w", err)
	}
	return nil
}

// loadPool restores configured shapes (after the pool devices were adopted)
// and starts their refills.
func (d *Daemon) loadPool() error {
	b, err := os.ReadFile(d.poolFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load warm pool config: %w", err)
	}
	var recs []poolShapeRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		return fmt.Errorf("load warm pool config %s: %w", d.poolFile(), err)
	}
	for _, r := range recs {
		d.pool.configure(shape{image: r.Image, size: r.Size}, r.Low, r.High, true)
	}
	return nil
}

// adopt puts a pool device found at startup back into its shape's pool.
func (p *warmPool) adopt(id uint32, s shape) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.get(s)
	ps.ready = append(ps.ready, id)
}

// forget drops a deleted device from any pool.
func (p *warmPool) forget(id uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ps := range p.shapes {
		for i, r := range ps.ready {
			if r == id {
				ps.ready = append(ps.ready[:i], ps.ready[i+1:]...)
				return
			}
		}
	}
}

// counts returns ready devices per image shape (for tests and status).
func (p *warmPool) ready(s shape) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps, ok := p.shapes[s]; ok {
		return len(ps.ready)
	}
	return 0
}

// refill starts a background fill when the shape is below its low watermark.
func (p *warmPool) refill(s shape) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.shapes[s]
	if !ok || ps.filling || len(ps.ready) >= ps.low || ps.high == 0 || p.d.ctx.Err() != nil {
		return
	}
	ps.filling = true
	p.d.bg.Add(1)
	go func() {
		defer p.d.bg.Done()
		p.fill(s, ps)
	}()
}

func (p *warmPool) fill(s shape, ps *poolShape) {
	defer func() {
		p.mu.Lock()
		ps.filling = false
		p.mu.Unlock()
	}()
	for p.d.ctx.Err() == nil {
		p.mu.Lock()
		full := len(ps.ready) >= ps.high
		p.mu.Unlock()
		if full {
			return
		}
		dv, err := p.d.newDevice(p.d.ctx, newSpec{kind: rpc.KindPool, image: s.image, size: s.size})
		if err != nil {
			p.d.log.Error("warm pool refill failed", "image", s.image, "size", s.size, "err", err)
			return
		}
		// A crash here leaves a pool device on disk that only the restarted
		// daemon's adoption puts in the ready list.
		if err := fpPoolAfterFill.Inject(); err != nil {
			p.d.log.Error("warm pool refill failed", "image", s.image, "size", s.size, "err", err)
			p.d.delete(p.d.ctx, dv.rec.ID, true)
			return
		}
		p.mu.Lock()
		ps.ready = append(ps.ready, dv.rec.ID)
		p.mu.Unlock()
	}
}
