// Package ctxio makes long copies cancellable: a reader that stops with the
// context's error once it is done, checked before every read.
package ctxio

import (
	"context"
	"io"
)

// Reader returns r reading until ctx is done.
func Reader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (c reader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
