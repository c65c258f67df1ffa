package qmp

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOversizedMessage: a peer that sends a message longer than MaxMessage
// gets its connection closed; the command waiting for it fails instead of
// aenvd reading without bound.
func TestOversizedMessage(t *testing.T) {
	t.Parallel()
	sock := fakeQEMU(t, func(cmd map[string]any, _ []int) any {
		if cmd["execute"] == "query-status" {
			return map[string]any{"return": map[string]any{"status": strings.Repeat("x", MaxMessage+1)}}
		}
		return map[string]any{"return": map[string]any{}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var st struct{ Status string }
	err = q.Execute(ctx, "query-status", nil, &st)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("a %d-byte reply: %v (status of %d bytes), want the connection closed", MaxMessage+1, err, len(st.Status))
	}
	select {
	case <-q.Done():
	case <-ctx.Done():
		t.Fatal("connection not closed")
	}
}

// pair is a connected pair of Unix stream sockets: ours and the peer's.
func pair(t testing.TB) (*net.UnixConn, *os.File) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "qmp")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "peer")
}

// FuzzReplies: whatever a peer sends after its greeting (any bytes, lines,
// ids, events, errors), the client neither panics nor hangs past its
// context: the handshake and a command return, and a command succeeds only
// on an answer carrying its id.
func FuzzReplies(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": "aenv-1"}` + "\n" + `{"event": "STOP", "data": {}}` + "\n" + `{"return": {"status": "running"}, "id": "aenv-2"}` + "\n"))
	f.Add([]byte(`{"return": {}, "id": "aenv-1"}` + "\n" + `{"error": {"class": "GenericError", "desc": "no"}, "id": "aenv-2"}` + "\n"))
	f.Add([]byte(`{"return": {}, "id": "aenv-1"}` + "\n" + `{"return": [1,2], "id": "aenv-2"}` + "\n"))
	f.Add([]byte(`{"return": {}, "id": "aenv-1"}` + "\n" + `{"return": {}, "id": "aenv-2"` + "\n"))
	f.Add([]byte(`{"id": "aenv-1", "error": null, "return": null}` + "\n" + `{"event": "", "id": "aenv-2", "data": 5}` + "\n" + "\x00\xff\n"))
	f.Add([]byte(`[]` + "\n" + `"aenv-1"` + "\n" + `{"id": 1}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, peer := pair(t)
		drained := make(chan struct{})
		defer func() { <-drained }()
		defer peer.Close()
		go func() {
			defer close(drained)
			peer.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
			peer.Write(data)
			// End of what the peer says: the client sees EOF, not a wait.
			syscall.Shutdown(int(peer.Fd()), syscall.SHUT_WR)
			// Drain the commands so the client's writes never block.
			buf := make([]byte, 4096)
			for {
				if _, err := peer.Read(buf); err != nil {
					return
				}
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		q, err := handshake(ctx, c)
		if err != nil {
			return
		}
		defer q.Close()
		var out map[string]any
		err = q.Execute(ctx, "query-status", nil, &out)
		if err == nil && !strings.Contains(string(data), "aenv-2") {
			t.Fatalf("a command succeeded without an answer carrying its id: %q", data)
		}
		var qe *Error
		if errors.As(err, &qe) && qe.Command != "query-status" {
			t.Fatalf("error reply names command %q", qe.Command)
		}
	})
}
