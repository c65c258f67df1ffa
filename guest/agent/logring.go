package agent

import (
	"bytes"
	"net/http"
	"sync"
)

// LogRing keeps the agent's most recent log lines in memory (an
// io.Writer for its slog handler) for GET /logs: the node reads them to
// answer E2B's GET /sandboxes/{id}/logs, also after a restore from a
// snapshot, when the guest console has nothing new to say.
type LogRing struct {
	mu    sync.Mutex
	lines [][]byte
	next  int
	full  bool
	part  []byte // a line not yet ended by '\n'
}

// Bounds of the ring.
const (
	logRingLines   = 1000
	logRingLineLen = 4 << 10
)

// NewLogRing returns an empty ring.
func NewLogRing() *LogRing { return &LogRing{lines: make([][]byte, logRingLines)} }

// Write implements io.Writer: complete lines enter the ring.
func (r *LogRing) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.part = appendBounded(r.part, p)
			break
		}
		r.add(appendBounded(r.part, p[:i]))
		r.part, p = nil, p[i+1:]
	}
	return n, nil
}

func appendBounded(dst, p []byte) []byte {
	room := logRingLineLen - len(dst)
	if room <= 0 {
		return dst
	}
	return append(dst, p[:min(len(p), room)]...)
}

func (r *LogRing) add(line []byte) {
	r.lines[r.next] = line
	r.next = (r.next + 1) % len(r.lines)
	if r.next == 0 {
		r.full = true
	}
}

// Lines returns the ring's lines, oldest first.
func (r *LogRing) Lines() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([][]byte(nil), r.lines[:r.next]...)
	}
	return append(append([][]byte(nil), r.lines[r.next:]...), r.lines[:r.next]...)
}

// handleLogs answers the ring as text, one line each, oldest first.
func (a *Agent) handleLogs(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.cfg.Logs == nil {
		return
	}
	for _, l := range a.cfg.Logs.Lines() {
		_, _ = w.Write(append(l, '\n'))
	}
}
