package image_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/storage/image"
)

// Example shows the life of an image as a block export uses it: create an
// empty image with a writable upper, write, trim, flush, commit the upper as
// a sealed layer, and continue on a new upper stacked on that layer.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "image-example-")
	defer os.RemoveAll(dir)

	cfg := filepath.Join(dir, "disk.json")
	if _, err := image.Create(ctx, cfg, image.CreateSpec{Size: 1 << 20}); err != nil {
		panic(err)
	}
	im, err := image.Open(ctx, cfg, image.Options{})
	if err != nil {
		panic(err)
	}
	im.WriteAt([]byte("hello, layers"), 4096)
	im.Trim(0, 512)
	im.Flush()
	layer, err := im.Commit(ctx, filepath.Join(dir, "base.lsmt"), image.CommitOptions{Message: "first"})
	if err != nil {
		panic(err)
	}
	im.Close()

	next := filepath.Join(dir, "disk.1.json")
	if _, err := image.Create(ctx, next, image.CreateSpec{Lowers: []string{"base.lsmt"}}); err != nil {
		panic(err)
	}
	im, err = image.Open(ctx, next, image.Options{})
	if err != nil {
		panic(err)
	}
	defer im.Close()
	buf := make([]byte, 13)
	im.ReadAt(buf, 4096)
	fmt.Printf("%s; size %d; layer has %d segments\n", buf, im.Size(), layer.Segments)
	// Output: hello, layers; size 1048576; layer has 2 segments
}
