package blob

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChunkTableRoundTrip(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, 4096, 4097, 3*65536 + 17} {
		data := content(size)
		tab, err := BuildChunkTable(bytes.NewReader(data), 65536)
		if err != nil {
			t.Fatal(err)
		}
		if tab.Size != int64(size) || tab.Layer != sha256.Sum256(data) || tab.Chunks() != int64((size+65535)/65536) {
			t.Fatalf("size %d: table %d bytes, %d chunks", size, tab.Size, tab.Chunks())
		}
		got, err := ParseChunkTable(tab.Encode())
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if !bytes.Equal(got.Encode(), tab.Encode()) {
			t.Fatalf("size %d: round trip changed the table", size)
		}
		for i := int64(0); i < got.Chunks(); i++ {
			chunk := data[i*65536 : min((i+1)*65536, int64(size))]
			if err := got.Verify(i, chunk); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			bad := bytes.Clone(chunk)
			bad[len(bad)/2] ^= 1
			if err := got.Verify(i, bad); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tab.LayerDigest()) {
				t.Fatalf("a flipped bit in chunk %d: %v", i, err)
			}
		}
	}
	if _, err := BuildChunkTable(bytes.NewReader(nil), 5000); err == nil {
		t.Fatal("accepted a chunk size that is not a power of two")
	}
}

func TestParseChunkTableRejects(t *testing.T) {
	t.Parallel()
	tab, _ := BuildChunkTable(bytes.NewReader(content(100000)), 4096)
	good := tab.Encode()
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":      nil,
		"magic":      mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"truncated":  good[:len(good)-1],
		"extra":      append(bytes.Clone(good), 0),
		"chunk size": mutate(func(b []byte) []byte { b[10] = 0x11; return b }),
		"reserved":   mutate(func(b []byte) []byte { b[15] = 1; return b }),
		"size":       mutate(func(b []byte) []byte { b[22] += 0x20; return b }),
		"huge size":  mutate(func(b []byte) []byte { b[16] = 0xff; return b }),
	}
	for name, data := range cases {
		if _, err := ParseChunkTable(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzParseChunkTable(f *testing.F) {
	tab, _ := BuildChunkTable(bytes.NewReader(content(10000)), 4096)
	f.Add(tab.Encode())
	f.Add([]byte(chunkMagic + "\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := ParseChunkTable(data)
		if err != nil {
			return
		}
		if !bytes.Equal(tab.Encode(), data) {
			t.Fatal("a parsed table does not encode back to its bytes")
		}
		if tab.Chunks() > 0 && tab.Verify(tab.Chunks()-1, nil) == nil && tab.chunkLen(tab.Chunks()-1) != 0 {
			t.Fatal("an empty chunk verified")
		}
	})
}

// bytesBlob is a Blob over memory (a source that can be made to lie).
type bytesBlob struct {
	name string
	data []byte
	size int64
}

func (b *bytesBlob) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(b.data).ReadAt(p, off)
}
func (b *bytesBlob) Size() int64  { return b.size }
func (b *bytesBlob) Name() string { return b.name }
func (b *bytesBlob) Close() error { return nil }

func layerFixture(t *testing.T, size int) ([]byte, *ChunkTable, string) {
	data := content(size)
	tab, err := BuildChunkTable(bytes.NewReader(data), 4096)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data, tab, p
}

func TestVerifiedReads(t *testing.T) {
	t.Parallel()
	data, tab, p := layerFixture(t, 10*4096+100)
	f, err := OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	c := OpenVerified(tab, "layer", CacheOptions{Capacity: 3 * 4096}, f)
	defer c.Close()
	for _, r := range []struct{ off, n int }{{0, 10}, {4000, 200}, {4096, 4096}, {40900, 160}, {0, len(data)}, {len(data) - 1, 1}} {
		got := make([]byte, r.n)
		if _, err := c.ReadAt(got, int64(r.off)); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("read [%d,+%d): %v", r.off, r.n, err)
		}
		if !bytes.Equal(got, data[r.off:r.off+r.n]) {
			t.Fatalf("read [%d,+%d) differs from the layer", r.off, r.n)
		}
	}
	// The cache keeps three chunks: a full read evicted the rest, and reading
	// them again fetches them again.
	_, misses0, _ := c.Stats()
	c.ReadAt(make([]byte, 1), 0)
	if _, misses, _ := c.Stats(); misses != misses0+1 {
		t.Fatalf("an evicted chunk was served without a fetch (misses %d -> %d)", misses0, misses)
	}
}

// TestVerifiedFallsBack: a source with flipped bytes is passed over for the
// next one; with only bad sources the read fails naming layer and chunk, and
// nothing of the bad bytes reaches the caller.
func TestVerifiedFallsBack(t *testing.T) {
	t.Parallel()
	data, tab, _ := layerFixture(t, 8*4096)
	corrupt := bytes.Clone(data)
	corrupt[5*4096+7] ^= 0xff
	bad := &bytesBlob{name: "bad-peer", data: corrupt, size: int64(len(data))}
	short := &bytesBlob{name: "truncated", data: data[:6*4096], size: int64(len(data))}
	wrongSize := &bytesBlob{name: "stale", data: data[:4096], size: 4096}
	good := &bytesBlob{name: "store", data: data, size: int64(len(data))}

	v := NewVerified(tab, "layer", bad, good)
	got := make([]byte, 4096)
	if _, err := v.ReadAt(got, 5*4096); err != nil || !bytes.Equal(got, data[5*4096:6*4096]) {
		t.Fatalf("read past a bad source: %v", err)
	}
	if fetched, rejected := v.Fetched(); fetched[0] != 0 || fetched[1] != 4096 || rejected[0] != 1 {
		t.Fatalf("fetched %v, rejected %v", fetched, rejected)
	}
	// A read of several chunks, one of them bad at the first source: the
	// good ones are kept, only the bad one comes from the next source.
	v = NewVerified(tab, "layer", bad, good)
	got = make([]byte, 6*4096)
	if _, err := v.ReadAt(got, 2*4096); err != nil || !bytes.Equal(got, data[2*4096:]) {
		t.Fatalf("a read of 6 chunks past one bad chunk: %v", err)
	}
	if fetched, rejected := v.Fetched(); fetched[0] != 5*4096 || fetched[1] != 4096 || rejected[0] != 1 {
		t.Fatalf("a read of 6 chunks, one bad at the first source: fetched %v, rejected %v (want 5 chunks, then 1)", fetched, rejected)
	}
	for _, src := range []Blob{bad, short, wrongSize} {
		v := NewVerified(tab, "layer", src)
		got := bytes.Repeat([]byte{0xaa}, 2*4096)
		n, err := v.ReadAt(got, 5*4096)
		if n != 0 || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tab.LayerDigest()) ||
			!strings.Contains(err.Error(), "chunk") {
			t.Fatalf("%s: read gave %d, %v", src.Name(), n, err)
		}
		if bytes.Contains(got, corrupt[5*4096:5*4096+64]) {
			t.Fatalf("%s: unverified bytes reached the caller's buffer", src.Name())
		}
		c := OpenVerified(tab, "layer", CacheOptions{}, src)
		if _, err := c.ReadAt(make([]byte, 4096), 5*4096+10); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s through the cache: %v", src.Name(), err)
		}
	}
}

// TestVerifiedOverHTTP: a server answering range requests with other bytes
// (a stale object behind a CDN) fails verification; one answering with a
// wrong Content-Range fails in the HTTP source before verification.
func TestVerifiedOverHTTP(t *testing.T) {
	t.Parallel()
	data, tab, _ := layerFixture(t, 6*4096)
	stale := content(len(data) + 1)[1:]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/good":
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		case "/stale":
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(stale))
		case "/shifted": // right header on the probe, then one chunk off
			var first, last int64
			fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &first, &last)
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first+4096, last+4096, len(data)))
			if first == 0 && last == 0 {
				w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-0/%d", len(data)))
			}
			w.WriteHeader(http.StatusPartialContent)
			w.Write(data[min(int(first)+4096, len(data)):min(int(last)+4097, len(data))])
		}
	}))
	defer srv.Close()
	ctx := t.Context()
	open := func(path string) Blob {
		h, err := OpenHTTP(ctx, srv.URL+path, HTTPOptions{Retries: 1})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	buf := make([]byte, 4096)
	if _, err := OpenVerified(tab, "l", CacheOptions{}, open("/good")).ReadAt(buf, 4096); err != nil || !bytes.Equal(buf, data[4096:8192]) {
		t.Fatalf("good server: %v", err)
	}
	if _, err := OpenVerified(tab, "l", CacheOptions{}, open("/stale")).ReadAt(buf, 4096); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("stale object: %v", err)
	}
	_, err := OpenVerified(tab, "l", CacheOptions{}, open("/shifted")).ReadAt(buf, 0)
	if err == nil || !strings.Contains(err.Error(), "Content-Range") {
		t.Fatalf("wrong Content-Range: %v", err)
	}
}
