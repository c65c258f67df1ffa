package orchestrator

import (
	"context"
	"fmt"
)

// DropCopy removes this node's copy of a sandbox that lives on elsewhere: a
// cluster node back from the dead still holding a sandbox another node
// resumed meanwhile from the snapshot repository. Its VM (a split brain,
// if one still runs), slot, device, directory and record go as in a kill,
// but nothing beyond this node is touched: the repository keeps every
// manifest and layer (the other node's copy came from them), and no killed
// event is published (the sandbox lives on). Recovery finishes a removal a
// crash interrupted, as it does a kill. It returns the state the copy was
// in.
func (o *Orchestrator) DropCopy(ctx context.Context, id string) (State, error) {
	s, err := o.lockOp(id)
	if err != nil {
		return "", err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	was, tmpl := rec.State, rec.TemplateID
	// No killed event: the sandbox lives on elsewhere.
	if err := o.journal.quietly(rec, Killing, func(r Record) { o.setRecord(s, r) }, fpDropRecorded); err != nil {
		return was, fmt.Errorf("drop stale copy of sandbox %s: %w", id, err)
	}
	o.stopTimer(s)
	if err := o.remove(ctx, s); err != nil {
		return was, fmt.Errorf("drop stale copy of sandbox %s: %w", id, err)
	}
	o.collectForkSnapshot(tmpl)
	return was, nil
}
