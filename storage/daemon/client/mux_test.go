package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// reverseServer accepts one connection, reads n requests and answers them
// in reverse order, each with its own id echoed in the result, then breaks
// the connection.
func reverseServer(t *testing.T, sock string, n int) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var reqs []rpc.Request
		for len(reqs) < n {
			var r rpc.Request
			if err := rpc.ReadFrame(c, &r); err != nil {
				return
			}
			reqs = append(reqs, r)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			var p rpc.IDParams
			json.Unmarshal(reqs[i].Params, &p)
			res, _ := json.Marshal(rpc.Device{ID: p.ID})
			resp := rpc.Response{ID: reqs[i].ID, Result: res}
			if p.ID%3 == 0 {
				resp = rpc.Response{ID: reqs[i].ID, Error: &rpc.Error{Code: rpc.CodeNotFound, Message: fmt.Sprint(p.ID)}}
			}
			rpc.WriteFrame(c, resp)
		}
		// One more call is outstanding: dropping the connection must fail it.
		var r rpc.Request
		rpc.ReadFrame(c, &r)
	}()
}

// TestCallsMultiplexed: concurrent calls share one connection, each gets
// its own answer although the answers come in reverse order; a call
// outstanding when the connection breaks fails instead of hanging.
func TestCallsMultiplexed(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "s.sock")
	const n = 8
	reverseServer(t, sock, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for i := range uint32(n) {
		wg.Go(func() {
			var dev rpc.Device
			err := c.Call(ctx, rpc.MethodDelete, rpc.IDParams{ID: i + 1}, &dev)
			switch {
			case (i+1)%3 == 0:
				if !errors.Is(err, rpc.ErrNotFound) {
					t.Errorf("call %d: %v, want not found", i+1, err)
				}
			case err != nil || dev.ID != i+1:
				t.Errorf("call %d got the answer for %d (%v)", i+1, dev.ID, err)
			}
		})
	}
	wg.Wait()
	if err := c.Call(ctx, rpc.MethodList, nil, nil); err == nil || ctx.Err() != nil {
		t.Fatalf("call on a connection the server dropped: %v", err)
	}
}
