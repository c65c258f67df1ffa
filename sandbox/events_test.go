package sandbox

import "testing"

func TestTransitionEvent(t *testing.T) {
	for _, c := range []struct {
		from, to State
		want     string
	}{
		{Starting, Running, EventCreated},
		{Resuming, Running, EventResumed},
		{Pausing, Paused, EventPaused},
		{Running, Killing, EventKilled},
		{Paused, Killing, EventKilled},
		{Killing, Killing, ""},
		{Pausing, Running, ""}, // a failed pause
		{Resuming, Paused, ""}, // a failed resume
		{Running, Running, ""}, // a timeout change
		{Running, Pausing, ""},
	} {
		if got := TransitionEvent(c.from, c.to); got != c.want {
			t.Errorf("%s -> %s: %q, want %q", c.from, c.to, got, c.want)
		}
	}
}

func TestSubscribe(t *testing.T) {
	var o Hub
	var got []string
	cancel := o.Subscribe(func(ev Event) { got = append(got, ev.Type+" "+ev.SandboxID) })
	o.Published(Starting, Record{ID: "a", State: Running})
	o.Published(Running, Record{ID: "a", State: Running})
	o.Publish(Event{Type: EventForked, SandboxID: "a"})
	cancel()
	o.Published(Running, Record{ID: "a", State: Killing})
	if len(got) != 2 || got[0] != EventCreated+" a" || got[1] != EventForked+" a" {
		t.Errorf("events %q, want created then forked, none after cancel", got)
	}
}
