package webhooks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/sandbox"
)

// waitAttempts waits until webhook id has n attempts recorded (a guard
// against a hang, not a measurement).
func waitAttempts(t *testing.T, d *Dispatcher, id string, n int) []Attempt {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := d.Attempts(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d attempts recorded, want %d", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttemptsRecorded: each try of a delivery is kept, newest first,
// with the receiver's status, the error and the outcome; the last allowed
// failure is a drop; deleting the webhook forgets them.
func TestAttemptsRecorded(t *testing.T) {
	rc := newReceiver(t, 2)
	st := openStore(t, t.TempDir())
	defer st.Close()
	d, err := New(st, Options{Backoff: 10 * time.Millisecond, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(context.Background())
	defer d.Close()
	h, err := d.Create(Webhook{URL: rc.srv.URL, Enabled: true, Events: []string{sandbox.EventPaused}})
	if err != nil {
		t.Fatal(err)
	}
	d.OnEvent(sandbox.Event{Type: sandbox.EventPaused, SandboxID: "sbx1"})
	got := waitAttempts(t, d, h.ID, 3)
	want := []struct {
		n, status int
		outcome   string
	}{{3, 204, Delivered}, {2, 503, Retrying}, {1, 503, Retrying}}
	for i, w := range want {
		a := got[i]
		if a.Number != w.n || a.StatusCode != w.status || a.Outcome != w.outcome || a.Event != sandbox.EventPaused ||
			a.SandboxID != "sbx1" || a.WebhookID != h.ID || a.DeliveryID != got[0].DeliveryID || a.Time.IsZero() {
			t.Errorf("attempt %d: %+v, want number %d, status %d, %s", i, a, w.n, w.status, w.outcome)
		}
		if (w.status == 503) != (a.Error != "") {
			t.Errorf("attempt %d: error %q with status %d", i, a.Error, a.StatusCode)
		}
	}

	rc.mu.Lock()
	rc.failFirst = 1000
	rc.mu.Unlock()
	d.OnEvent(sandbox.Event{Type: sandbox.EventPaused, SandboxID: "sbx2"})
	got = waitAttempts(t, d, h.ID, 6)
	if got[0].Outcome != Dropped || got[0].Number != 3 || got[0].SandboxID != "sbx2" {
		t.Errorf("the last failure %+v, want attempt 3 dropped", got[0])
	}
	if err := d.Delete(h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Attempts(h.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("attempts of a deleted webhook: %v, want ErrNotFound", err)
	}
}

// TestAttemptsBounded: a webhook keeps its last keptAttempts attempts,
// newest first, while they are read concurrently (for -race).
func TestAttemptsBounded(t *testing.T) {
	rc := newReceiver(t, 0)
	st := openStore(t, t.TempDir())
	defer st.Close()
	d, err := New(st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(context.Background())
	defer d.Close()
	h, err := d.Create(Webhook{URL: rc.srv.URL, Enabled: true, Events: []string{sandbox.EventCreated}})
	if err != nil {
		t.Fatal(err)
	}
	const n = keptAttempts + 20
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				if _, err := d.Attempts(h.ID); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	for i := range n {
		d.OnEvent(sandbox.Event{Type: sandbox.EventCreated, SandboxID: fmt.Sprintf("s%03d", i)})
		rc.await(t, i+1) // one at a time: the order of sending is the order of events
		waitPending(t, d)
	}
	close(stop)
	wg.Wait()
	got, err := d.Attempts(h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != keptAttempts {
		t.Fatalf("%d attempts kept, want %d", len(got), keptAttempts)
	}
	for i, a := range got {
		if want := fmt.Sprintf("s%03d", n-1-i); a.SandboxID != want || a.Outcome != Delivered {
			t.Errorf("attempt %d is of %s (%s), want %s delivered", i, a.SandboxID, a.Outcome, want)
		}
	}
}
