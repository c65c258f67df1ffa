package template

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/ctxio"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// Template files (the archives of COPY steps), stored by the key the
// client names: aenv's is the archive's SHA-256, E2B's SDK's its filesHash
// of the copy step (its sources, destination and options), which is not a
// hash of the archive. The key is a cache key, as on E2B: an upload is
// not checked against it.

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func (b *Builder) filesPath(hash string) string {
	return filepath.Join(b.cfg.DataDir, "template-files", hash+".tar")
}

// FilesPresent reports whether the archive with hash was uploaded
// (the template must exist).
func (b *Builder) FilesPresent(templateID, hash string) (bool, error) {
	if !validHash(hash) {
		return false, fmt.Errorf("files hash %q: want 64 lowercase hex characters: %w", hash, errdefs.ErrInvalid)
	}
	if _, ok := b.Resolve(templateID); !ok {
		if _, err := b.host.Committed(templateID); err != nil {
			return false, err
		}
	}
	_, err := os.Stat(b.filesPath(hash))
	return err == nil, nil
}

// PutFiles stores r (an archive, at most MaxTemplateFiles bytes) under
// hash; errdefs.ErrInvalid when it is larger.
func (b *Builder) PutFiles(ctx context.Context, templateID, hash string, r io.Reader) error {
	if ok, err := b.FilesPresent(templateID, hash); err != nil || ok {
		if ok {
			_, _ = io.Copy(io.Discard, io.LimitReader(r, MaxTemplateFiles)) // already stored: content-addressed
		}
		return err
	}
	dst := b.filesPath(hash)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("store template files %s: %w", hash, err)
	}
	err := atomicfile.Write(dst, 0o600, func(w io.Writer) error {
		n, err := io.Copy(w, ctxio.Reader(ctx, io.LimitReader(r, MaxTemplateFiles+1)))
		if err != nil {
			return err
		}
		if n > MaxTemplateFiles {
			return fmt.Errorf("template files %s: larger than %d bytes: %w", hash, int64(MaxTemplateFiles), errdefs.ErrInvalid)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store template files %s: %w", hash, err)
	}
	return nil
}
