package image

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLockWaitIsLogged: a caller waiting on the cache's lock says so once
// (a node start waiting on another build would otherwise print nothing),
// and gives up when its context ends.
func TestLockWaitIsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lock")
	unlock, err := lockFile(context.Background(), path, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = lockFile(ctx, path, slog.New(slog.NewTextHandler(&buf, nil)))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want the context's deadline", err)
	}
	if n := strings.Count(buf.String(), "guest image cache busy"); n != 1 {
		t.Fatalf("the wait was logged %d times, want once:\n%s", n, buf.String())
	}
}
