package daemon

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

func TestWarmPool(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 8)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 2}); err != nil {
		t.Fatal(err)
	}
	pool := waitPool(t, h.c, 2)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pool, dev.ID) || dev.Kind != rpc.KindRuntime || dev.Owner != "sb" {
		t.Fatalf("create did not take a pool device: %+v (pool %v)", dev, pool)
	}
	if got := readAll(t, dialDev(t, dev), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("pool device content differs")
	}
	// Below the low watermark? 1 left == low, so no refill yet; take another.
	if _, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.c, 2) // refilled in the background to the high watermark

	// A restarted daemon adopts the pool devices and keeps the watermarks
	// (the daemon defaults are 0/0, so only the saved config refills).
	h.stop()
	h2 := start(t, opts)
	pool = waitPool(t, h2.c, 2)
	for range 2 {
		dev, err := h2.c.Create(ctx, rpc.CreateParams{Image: f.config})
		if err != nil || !slices.Contains(pool, dev.ID) {
			t.Fatalf("create after restart: %+v %v (pool %v)", dev, err, pool)
		}
	}
	waitPool(t, h2.c, 2)
}

// waitPool polls until n pool devices exist (no timing assertion: the test
// deadline is the only bound).
func waitPool(t *testing.T, c *client.Client, n int) []uint32 {
	t.Helper()
	for {
		devs, err := c.List(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		for _, d := range devs {
			if d.Kind == rpc.KindPool {
				ids = append(ids, d.ID)
			}
		}
		if len(ids) == n {
			return ids
		}
		if len(ids) > n {
			t.Fatalf("pool grew past its high watermark: %v", ids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
