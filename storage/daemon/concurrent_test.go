package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestSlowRestackDoesNotStallCreate holds a restack inside its sealing step
// and checks that creates, lists and deletes on the same client connection
// complete meanwhile. Not parallel: the step hook is global.
func TestSlowRestackDoesNotStallCreate(t *testing.T) {
	f := newFixture(t, 41)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	reached, resume := stopAt(t, "storaged/restack/after-seal")
	restacked := make(chan error, 1)
	go func() {
		_, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
		restacked <- err
	}()
	<-reached
	other, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatalf("create while a restack runs: %v", err)
	}
	if _, err := h.c.List(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Delete(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-restacked:
		t.Fatalf("restack returned while held: %v", err)
	default:
	}
	close(resume)
	if err := <-restacked; err != nil {
		t.Fatal(err)
	}
}

// TestServerAnswersOutOfOrder sends a restack (held) and then a features
// call on one raw connection: the second is answered first, each answer
// carrying its request's id.
func TestServerAnswersOutOfOrder(t *testing.T) {
	f := newFixture(t, 42)
	h := start(t, testOptions(t))
	dev, err := h.c.Create(ctxT(t), rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	reached, resume := stopAt(t, "storaged/restack/after-intent")
	conn, err := net.Dial("unix", h.opts.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	params, _ := json.Marshal(rpc.RestackParams{ID: dev.ID})
	if err := rpc.WriteFrame(conn, rpc.Request{ID: 7, Method: rpc.MethodRestack, Params: params}); err != nil {
		t.Fatal(err)
	}
	<-reached
	if err := rpc.WriteFrame(conn, rpc.Request{ID: 8, Method: rpc.MethodFeatures}); err != nil {
		t.Fatal(err)
	}
	var first, second rpc.Response
	if err := rpc.ReadFrame(conn, &first); err != nil {
		t.Fatal(err)
	}
	close(resume)
	if err := rpc.ReadFrame(conn, &second); err != nil {
		t.Fatal(err)
	}
	if first.ID != 8 || first.Error != nil || second.ID != 7 || second.Error != nil {
		t.Fatalf("answers %+v then %+v, want 8 then 7, both without error", first, second)
	}
}

// TestCancelledCallLeavesConnection: a call whose context ends returns at
// once, and the connection keeps serving other calls (the late answer is
// dropped).
func TestCancelledCallLeavesConnection(t *testing.T) {
	f := newFixture(t, 43)
	h := start(t, testOptions(t))
	dev, err := h.c.Create(ctxT(t), rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	reached, resume := stopAt(t, "storaged/restack/after-intent")
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
		done <- err
	}()
	<-reached
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled restack: %v", err)
	}
	close(resume)
	if _, err := h.c.Features(ctxT(t)); err != nil {
		t.Fatalf("connection after a cancelled call: %v", err)
	}
	// The restack itself went on in the daemon.
	for {
		devs, err := h.c.List(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 1 && len(devs[0].Layers) == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}
