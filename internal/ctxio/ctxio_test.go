package ctxio

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := Reader(ctx, strings.NewReader("abcdef"))
	b := make([]byte, 3)
	if n, err := r.Read(b); n != 3 || err != nil {
		t.Fatalf("read before cancel: %d %v", n, err)
	}
	cancel()
	if _, err := io.ReadAll(r); !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %v", err)
	}
}
