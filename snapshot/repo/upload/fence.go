package upload

import (
	"context"
	"errors"
	"fmt"
)

// A Fence keeps a node from committing what it no longer owns: in a
// cluster, a pause of a sandbox that was moved to another node while this
// one was cut off (its commit would put a stale state where the other
// node's pauses go). Stamp runs when a job is queued and its answer is kept
// with the job (durably); Check runs right before the manifest is
// committed, after the blobs are uploaded (blobs are content-addressed:
// uploading them overwrites nothing). Check refusing with ErrFenced fails
// the job for good; any other error is retried like a store that is down.
type Fence interface {
	Stamp(name string) string
	Check(ctx context.Context, name, stamp string) error
}

// ErrFenced is a commit its Fence refused: the node no longer owns what the
// job would commit.
var ErrFenced = errors.New("fenced: the node no longer owns it")

// SetFence installs f (before Start); nil removes it.
func (u *Uploader) SetFence(f Fence) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.fence = f
}

func (u *Uploader) stamp(j *Job) {
	if u.fence != nil && j.Fence == "" {
		j.Fence = u.fence.Stamp(j.Name)
	}
}

// checkFence runs the fence's check of j, if any.
func (u *Uploader) checkFence(ctx context.Context, j Job) error {
	u.mu.Lock()
	f := u.fence
	u.mu.Unlock()
	if f == nil {
		return nil
	}
	if err := f.Check(ctx, j.Name, j.Fence); err != nil {
		return fmt.Errorf("commit %s: %w", j.Name, err)
	}
	return nil
}
