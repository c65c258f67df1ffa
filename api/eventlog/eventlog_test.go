package eventlog

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/sandbox"
)

func ev(id, typ string, n int) sandbox.Event {
	return sandbox.Event{Type: typ, SandboxID: id, Time: time.Unix(int64(n), 0), Metadata: map[string]string{"n": fmt.Sprint(n)}}
}

// seconds lists the entries' times (unix seconds), in the order given.
func seconds(es []Entry) []int64 {
	out := []int64{}
	for _, e := range es {
		out = append(out, e.Time.Unix())
	}
	return out
}

func equal(a, b []int64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

func TestOrderAndPaging(t *testing.T) {
	l := New(Limits{})
	for i := 1; i <= 5; i++ {
		l.OnEvent(ev("a", sandbox.EventPaused, i))
	}
	for _, c := range []struct {
		q    Query
		want []int64
	}{
		{Query{}, []int64{5, 4, 3, 2, 1}},
		{Query{Asc: true}, []int64{1, 2, 3, 4, 5}},
		{Query{Limit: 2}, []int64{5, 4}},
		{Query{Offset: 1, Limit: 2}, []int64{4, 3}},
		{Query{Offset: 4, Limit: 2, Asc: true}, []int64{5}},
		{Query{Offset: 5}, []int64{}},
		{Query{Offset: 99, Limit: 1}, []int64{}},
	} {
		got, ok := l.Sandbox("a", c.q)
		if !ok || !equal(seconds(got), c.want) {
			t.Errorf("Sandbox(a, %+v) = %v, %v; want %v", c.q, seconds(got), ok, c.want)
		}
		if got := l.Recent(c.q); !equal(seconds(got), c.want) {
			t.Errorf("Recent(%+v) = %v; want %v", c.q, seconds(got), c.want)
		}
	}
	if got, ok := l.Sandbox("nobody", Query{}); ok || len(got) != 0 {
		t.Errorf("an unknown sandbox has events %v (known %v)", got, ok)
	}
}

func TestTypesAndIDs(t *testing.T) {
	l := New(Limits{})
	l.OnEvent(ev("a", sandbox.EventCreated, 1))
	l.OnEvent(ev("a", sandbox.EventPaused, 2))
	l.OnEvent(ev("b", sandbox.EventCreated, 3))
	l.OnEvent(ev("a", sandbox.EventResumed, 4))
	got := l.Recent(Query{Types: []string{sandbox.EventCreated}})
	if !equal(seconds(got), []int64{3, 1}) {
		t.Errorf("created events %v, want [3 1]", seconds(got))
	}
	got, _ = l.Sandbox("a", Query{Asc: true, Types: []string{sandbox.EventPaused, sandbox.EventResumed}})
	if !equal(seconds(got), []int64{2, 4}) {
		t.Errorf("a's pause and resume %v, want [2 4]", seconds(got))
	}
	seen := map[string]bool{}
	for _, e := range l.Recent(Query{}) {
		if len(e.ID) != 32 || seen[e.ID] {
			t.Errorf("event id %q is not a fresh 128-bit hex id", e.ID)
		}
		seen[e.ID] = true
	}
}

func TestMetadataIsCopied(t *testing.T) {
	l := New(Limits{})
	e := ev("a", sandbox.EventCreated, 1)
	l.OnEvent(e)
	e.Metadata["n"] = "changed"
	if got := l.Recent(Query{})[0].Metadata["n"]; got != "1" {
		t.Errorf("the log's metadata changed with the publisher's map: %q", got)
	}
}

func TestCapsHold(t *testing.T) {
	l := New(Limits{Recent: 10, PerSandbox: 3, Sandboxes: 4})
	for i := 1; i <= 48; i++ {
		l.OnEvent(ev(fmt.Sprintf("s%d", i%4), sandbox.EventPaused, i))
	}
	if got := l.Recent(Query{}); !equal(seconds(got), []int64{48, 47, 46, 45, 44, 43, 42, 41, 40, 39}) {
		t.Errorf("recent %v, want the last 10 newest first", seconds(got))
	}
	got, ok := l.Sandbox("s2", Query{})
	if !ok || !equal(seconds(got), []int64{46, 42, 38}) {
		t.Errorf("s2 %v, want its last 3 [46 42 38]", seconds(got))
	}
	// Last active: s0 (48), s3 (47), s2 (46), s1 (45). A new sandbox pushes
	// out the least recently active: s1 was active again, so s2.
	l.OnEvent(ev("s1", sandbox.EventResumed, 49))
	l.OnEvent(ev("s4", sandbox.EventCreated, 50))
	if l.Len() != 4 {
		t.Errorf("%d sandboxes kept, want 4", l.Len())
	}
	if _, ok := l.Sandbox("s2", Query{}); ok {
		t.Error("s2 was the least recently active but is still kept")
	}
	for _, id := range []string{"s0", "s1", "s3", "s4"} {
		if _, ok := l.Sandbox(id, Query{}); !ok {
			t.Errorf("%s was forgotten", id)
		}
	}
}

// TestConcurrent is for -race: writers and readers at once, and the caps
// hold after.
func TestConcurrent(t *testing.T) {
	l := New(Limits{Recent: 50, PerSandbox: 5, Sandboxes: 8})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				l.OnEvent(ev(fmt.Sprintf("w%d-%d", w, i%20), sandbox.EventPaused, i))
			}
		})
		wg.Go(func() {
			for i := range 500 {
				_ = l.Recent(Query{Limit: 10})
				_, _ = l.Sandbox(fmt.Sprintf("w%d-%d", w, i%20), Query{Asc: true})
			}
		})
	}
	wg.Wait()
	if n := len(l.Recent(Query{})); n != 50 {
		t.Errorf("recent holds %d, want 50", n)
	}
	if l.Len() != 8 {
		t.Errorf("%d sandboxes kept, want 8", l.Len())
	}
	for _, e := range l.Recent(Query{}) {
		if got, _ := l.Sandbox(e.SandboxID, Query{}); len(got) > 5 {
			t.Errorf("%s holds %d events, want at most 5", e.SandboxID, len(got))
		}
	}
}
