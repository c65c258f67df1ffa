package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// fakeQEMU is a minimal QMP peer on a Unix socket, for the client's own
// protocol handling (greeting, ids, errors, events, descriptor passing).
// The real QEMU is exercised by the driver's conformance suite.
func fakeQEMU(t *testing.T, handle func(cmd map[string]any, fds []int) any) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		buf := make([]byte, 4096)
		oob := make([]byte, 256)
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			var fds []int
			if msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn]); len(msgs) > 0 {
				fds, _ = syscall.ParseUnixRights(&msgs[0])
			}
			sc := bufio.NewScanner(bytes.NewReader(buf[:n]))
			for sc.Scan() {
				var cmd map[string]any
				if json.Unmarshal(sc.Bytes(), &cmd) != nil {
					continue
				}
				reply := handle(cmd, fds)
				c.Write([]byte(`{"event": "STOP", "data": {}}` + "\n"))
				b, _ := json.Marshal(reply)
				var m map[string]any
				_ = json.Unmarshal(b, &m)
				m["id"] = cmd["id"]
				b, _ = json.Marshal(m)
				c.Write(append(b, '\n'))
			}
		}
	}()
	return sock
}

func TestExecute(t *testing.T) {
	t.Parallel()
	var gotFD bool
	sock := fakeQEMU(t, func(cmd map[string]any, fds []int) any {
		switch cmd["execute"] {
		case "qmp_capabilities":
			return map[string]any{"return": map[string]any{}}
		case "query-status":
			return map[string]any{"return": map[string]any{"status": "running"}}
		case "getfd":
			gotFD = len(fds) == 1
			for _, fd := range fds {
				syscall.Close(fd)
			}
			return map[string]any{"return": map[string]any{}}
		default:
			return map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "nope"}}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var st struct{ Status string }
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("query-status: %v %+v", err, st)
	}
	f, _ := os.Open(os.DevNull)
	defer f.Close()
	if err := q.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "x"}, f, nil); err != nil || !gotFD {
		t.Fatalf("getfd: err %v, descriptor received %v", err, gotFD)
	}
	var qe *Error
	if err := q.Execute(ctx, "bogus", nil, nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("error reply: %v", err)
	}
	select {
	case ev := <-q.Events():
		if ev.Name != "STOP" {
			t.Fatalf("event %q", ev.Name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event delivered")
	}
}

func TestDialGivesUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Fatal("dial of a missing socket succeeded")
	}
}

func TestClosedConnection(t *testing.T) {
	t.Parallel()
	sock := fakeQEMU(t, func(cmd map[string]any, _ []int) any { return map[string]any{"return": map[string]any{}} })
	ctx := context.Background()
	q, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	if err := q.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("execute on closed connection: %v", err)
	}
}
