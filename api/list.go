package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
)

// parseMetadata reads E2B's metadata filter: "k=v&k2=v2" (itself url-encoded in the query).
func parseMetadata(q *string) (map[string]string, error) {
	if q == nil || *q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(*q)
	if err != nil {
		return nil, fmt.Errorf("metadata filter: %w", err)
	}
	out := map[string]string{}
	for k, v := range vals {
		out[k] = v[len(v)-1]
	}
	return out, nil
}

func matches(rec orchestrator.Record, md map[string]string) bool {
	for k, v := range md {
		if got, ok := rec.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ListSandboxes implements ServerInterface: running sandboxes only.
func (s *Server) ListSandboxes(w http.ResponseWriter, r *http.Request, params wire.ListSandboxesParams) {
	md, err := parseMetadata(params.Metadata)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	out := []wire.ListedSandbox{}
	for _, rec := range s.o.List() {
		if rec.State != orchestrator.Starting && listedState(rec.State) == wire.Running && matches(rec, md) {
			out = append(out, listed(rec))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// listQuery is a parsed GET /v2/sandboxes: which sandboxes, in which
// order, and the page.
type listQuery struct {
	states   map[wire.SandboxState]bool
	metadata map[string]string
	// after and before bound the start time (at or after, strictly
	// before); zero means unbounded.
	after, before time.Time
	// templates holds the template ids the template filter accepts; nil
	// accepts any.
	templates map[string]bool
	asc       bool
	limit     int
	// from is the cursor of the last sandbox of the previous page.
	from string
}

// parseListQuery reads the parameters of GET /v2/sandboxes the way E2B's
// API defines them; an error is the client's (400).
func (s *Server) parseListQuery(params wire.ListSandboxesV2Params) (listQuery, error) {
	q := listQuery{states: map[wire.SandboxState]bool{wire.Running: true, wire.Paused: true}, limit: 100}
	var err error
	if q.metadata, err = parseMetadata(params.Metadata); err != nil {
		return q, err
	}
	if params.State != nil && *params.State != "" {
		q.states = map[wire.SandboxState]bool{}
		for _, st := range strings.Split(*params.State, ",") {
			st := wire.SandboxState(strings.TrimSpace(st))
			if !st.Valid() {
				return q, fmt.Errorf("state %q: want running or paused", st)
			}
			q.states[st] = true
		}
	}
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 100 {
			return q, fmt.Errorf("limit must be 1..100")
		}
		q.limit = int(*params.Limit)
	}
	if params.Order != nil && *params.Order != "" {
		if !params.Order.Valid() {
			return q, fmt.Errorf("order %q: want asc or desc", *params.Order)
		}
		q.asc = *params.Order == wire.Asc
	}
	if q.after, err = parseTime("startedAfter", params.StartedAfter); err != nil {
		return q, err
	}
	if q.before, err = parseTime("startedBefore", params.StartedBefore); err != nil {
		return q, err
	}
	if params.Template != nil && *params.Template != "" {
		name := *params.Template
		q.templates = map[string]bool{name: true}
		if t, err := s.o.ResolveTemplate(name); err == nil { // a name stands for its template's id
			q.templates[t.ID] = true
		}
	}
	if params.NextToken != nil && *params.NextToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(*params.NextToken)
		if err != nil || len(b) == 0 {
			return q, fmt.Errorf("invalid nextToken")
		}
		// An ascending cursor starts with "a:", a descending one with a digit.
		if q.from = string(b); strings.HasPrefix(q.from, "a:") != q.asc {
			return q, fmt.Errorf("nextToken was made for the other order")
		}
	}
	return q, nil
}

// parseTime reads an optional RFC 3339 time (JavaScript's toISOString
// gives one with milliseconds).
func parseTime(name string, v *string) (time.Time, error) {
	if v == nil || *v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, *v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time: %w", name, *v, err)
	}
	return t, nil
}

// keep says whether rec is listed.
func (q *listQuery) keep(rec orchestrator.Record) bool {
	switch {
	case rec.State == orchestrator.Starting, !q.states[listedState(rec.State)], !matches(rec, q.metadata):
		return false
	case !q.after.IsZero() && rec.StartedAt.Before(q.after):
		return false
	case !q.before.IsZero() && !rec.StartedAt.Before(q.before):
		return false
	case q.templates != nil && !q.templates[rec.TemplateID]:
		return false
	}
	return true
}

func (q *listQuery) cursor(rec orchestrator.Record) string {
	if q.asc {
		return ascCursor(rec)
	}
	return cursor(rec)
}

// ListSandboxesV2 implements ServerInterface: filters (state, metadata,
// start time, template), order by start time and pagination. The order
// holds across pages: a page's cursor is a position in the whole order.
func (s *Server) ListSandboxesV2(w http.ResponseWriter, r *http.Request, params wire.ListSandboxesV2Params) {
	q, err := s.parseListQuery(params)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	type entry struct {
		key string
		rec orchestrator.Record
	}
	var all []entry
	for _, rec := range s.o.List() {
		if q.keep(rec) {
			all = append(all, entry{q.cursor(rec), rec})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].key < all[j].key })
	out := []wire.ListedSandbox{}
	last, next := "", ""
	for _, e := range all {
		if q.from != "" && e.key <= q.from {
			continue
		}
		if len(out) == q.limit {
			next = base64.RawURLEncoding.EncodeToString([]byte(last))
			break
		}
		out = append(out, listed(e.rec))
		last = e.key
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// cursor orders records as List does (newest first, then id) as
// increasing strings.
func cursor(rec orchestrator.Record) string {
	return fmt.Sprintf("%020d:%s", int64(1<<62)-rec.StartedAt.UnixNano(), rec.ID)
}

// ascCursor orders records oldest first, then by id, as increasing
// strings; its "a:" prefix keeps it apart from cursor's.
func ascCursor(rec orchestrator.Record) string {
	return fmt.Sprintf("a:%020d:%s", int64(1<<62)+rec.StartedAt.UnixNano(), rec.ID)
}
