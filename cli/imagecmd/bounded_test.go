package imagecmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// TestCheckBoundedByData: check of a small layer claiming a huge virtual
// size, or mapping its few data sectors over and over, costs what the file
// holds, not what it claims.
func TestCheckBoundedByData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// 256 TiB claimed, 8 KiB of data at both ends.
	huge := filepath.Join(dir, "huge.lsmt")
	var out bytes.Buffer
	x, err := lsmt.NewExtentWriter(&out, lsmt.SealOptions{VirtualSize: 1 << 48})
	if err != nil {
		t.Fatal(err)
	}
	x.WriteData(0, bytes.Repeat([]byte{1}, 4096))
	x.WriteData(1<<48-4096, bytes.Repeat([]byte{2}, 4096))
	if _, err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(huge, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := NewCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"check", huge})
	start := time.Now()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("check of a %d-byte layer claiming 256 TiB: %v (after %v)", len(out.Bytes()), err, time.Since(start).Round(time.Millisecond))
	}
}
