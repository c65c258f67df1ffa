package upload

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// queueFile is the queue's one file: every change rewrites it atomically.
const queueFile = "uploads.json"

// maxQueueFile bounds the file read at startup.
const maxQueueFile = 64 << 20

type queue struct {
	path string
	recs map[string]*record
}

func loadQueue(dir string) (*queue, error) {
	if dir == "" {
		return nil, fmt.Errorf("upload queue: no directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("upload queue %s: %w", dir, err)
	}
	q := &queue{path: filepath.Join(dir, queueFile), recs: map[string]*record{}}
	st, err := os.Stat(q.path)
	if errors.Is(err, fs.ErrNotExist) {
		return q, nil
	}
	if err != nil {
		return nil, fmt.Errorf("upload queue %s: %w", q.path, err)
	}
	if st.Size() > maxQueueFile {
		return nil, fmt.Errorf("upload queue %s: %d bytes, more than %d", q.path, st.Size(), maxQueueFile)
	}
	data, err := os.ReadFile(q.path)
	if err != nil {
		return nil, fmt.Errorf("upload queue %s: %w", q.path, err)
	}
	var recs []record
	if err := json.Unmarshal(data, &recs); err != nil {
		return nil, fmt.Errorf("upload queue %s: %w", q.path, err)
	}
	for _, rec := range recs {
		if rec.Status.State == Uploading {
			rec.Status.State = Pending // the process that uploaded it is gone
		}
		if validJob(rec.Job) != nil || rec.Job.Name != rec.Status.Name || !knownState(rec.Status.State) || q.recs[rec.Job.Name] != nil {
			return nil, fmt.Errorf("upload queue %s: a bad record %q", q.path, rec.Job.Name)
		}
		q.recs[rec.Job.Name] = &rec
	}
	return q, nil
}

// knownState is one of the states a job can be in (a record in another
// would never be claimed, uploaded or failed: stuck for good).
func knownState(s State) bool {
	return s == Pending || s == Uploading || s == Uploaded || s == Failed
}

func (q *queue) get(name string) (record, bool) {
	rec, ok := q.recs[name]
	if !ok {
		return record{}, false
	}
	return *rec, true
}

func (q *queue) put(rec record) error {
	old, had := q.recs[rec.Job.Name]
	q.recs[rec.Job.Name] = &rec
	if err := q.save(); err != nil {
		if had {
			q.recs[rec.Job.Name] = old
		} else {
			delete(q.recs, rec.Job.Name)
		}
		return err
	}
	return nil
}

func (q *queue) setStatus(st Status) error {
	rec, ok := q.recs[st.Name]
	if !ok {
		return fmt.Errorf("upload queue: no job %s", st.Name)
	}
	c := *rec
	c.Status = st
	return q.put(c)
}

func (q *queue) remove(name string) error {
	old, ok := q.recs[name]
	if !ok {
		return nil
	}
	delete(q.recs, name)
	if err := q.save(); err != nil {
		q.recs[name] = old
		return err
	}
	return nil
}

func (q *queue) save() error {
	recs := make([]record, 0, len(q.recs))
	for _, rec := range q.recs {
		recs = append(recs, *rec)
	}
	data, err := json.MarshalIndent(recs, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(q.path, data, 0o600)
}
