package files_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/guest/agent/agenttest"
)

// uploaded is the part of E2B's EntryInfo (POST /files) these tests read.
type uploaded struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata"`
}

// upload posts body to path with the given headers (name, value pairs; a
// repeated name adds a value) and decodes the answer.
func upload(t *testing.T, srv *agenttest.Server, path, body string, hdr ...string) []uploaded {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, fileURL(srv, path), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/octet-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, b := do(t, req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: %d %s", path, resp.StatusCode, b)
	}
	var es []uploaded
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return es
}

// xattrs returns path's user.e2b.* attributes without the prefix.
func xattrs(t *testing.T, path string) map[string]string {
	t.Helper()
	buf := make([]byte, 1<<16)
	n, err := syscall.Listxattr(path, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", path, err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, "user.e2b.")
		if !ok {
			continue
		}
		val := make([]byte, 1<<16)
		m, err := syscall.Getxattr(path, name, val)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", path, name, err)
		}
		out[key] = string(val[:m])
	}
	return out
}

func needXattrs(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	if err := syscall.Setxattr(p, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("no user xattrs in %s: %v", dir, err)
	}
}

// TestUploadMetadata: as E2B's agent, POST /files stores the X-Metadata-*
// headers (key lowercased, first value) as user.e2b.* xattrs, answers them
// as the entry's metadata, and every upload replaces the metadata: keys it
// does not send are removed, and an upload without any clears them all.
func TestUploadMetadata(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	dir := t.TempDir()
	needXattrs(t, dir)
	p := filepath.Join(dir, "meta.txt")
	check := func(step string, es []uploaded, want map[string]string) {
		t.Helper()
		if len(es) != 1 || es[0].Path != p || !maps.Equal(es[0].Metadata, want) {
			t.Fatalf("%s: answer %+v, want metadata %v", step, es, want)
		}
		if got := xattrs(t, p); !maps.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%s: xattrs %v, want %v", step, got, want)
		}
	}
	check("first upload", upload(t, srv, p, "one", "X-Metadata-Purpose", "test", "X-Metadata-Owner", "alice",
		"x-metadata-MixedCase", "first", "X-Metadata-Mixedcase", "second"),
		map[string]string{"purpose": "test", "owner": "alice", "mixedcase": "first"})
	check("overwrite with one key", upload(t, srv, p, "two", "X-Metadata-Purpose", "other"), map[string]string{"purpose": "other"})
	if got, _ := os.ReadFile(p); string(got) != "two" {
		t.Fatalf("content %q", got)
	}
	es := upload(t, srv, p, "three")
	check("overwrite without metadata", es, nil)
	if raw, _ := json.Marshal(es[0]); strings.Contains(string(raw), `"metadata":{`) {
		t.Fatalf("an entry without metadata: %s", raw)
	}

	// A multipart upload gives every file the same metadata.
	body, ct := multipartBody(t, filepath.Join(dir, "m1"), "1", filepath.Join(dir, "m2"), "2")
	req, _ := http.NewRequest(http.MethodPost, fileURL(srv, ""), body)
	req.Header.Set("Content-Type", ct)
	req.Header.Set("X-Metadata-Batch", "7")
	resp, b := do(t, req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("multipart: %d %s", resp.StatusCode, b)
	}
	var multi []uploaded
	if err := json.Unmarshal(b, &multi); err != nil || len(multi) != 2 {
		t.Fatalf("multipart answer %s: %v", b, err)
	}
	for _, e := range multi {
		if want := map[string]string{"batch": "7"}; !maps.Equal(e.Metadata, want) || !maps.Equal(xattrs(t, e.Path), want) {
			t.Fatalf("multipart %s: answer %v, xattrs %v", e.Path, e.Metadata, xattrs(t, e.Path))
		}
	}
}

// TestUploadMetadataLimits: keys and values are printable US-ASCII, a key
// at most 246 bytes, all of a file's metadata (with the prefix per key) at
// most 4096 bytes; anything else is a 400 that leaves the file untouched.
func TestUploadMetadataLimits(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	dir := t.TempDir()
	needXattrs(t, dir)
	p := filepath.Join(dir, "keep.txt")
	upload(t, srv, p, "original", "X-Metadata-Kept", "yes")
	upload(t, srv, filepath.Join(dir, "longkey"), "x", "X-Metadata-"+strings.Repeat("k", 246), "ok")
	// 3*len("user.e2b.") + 3 + 3700 bytes, below E2B's cap and within one ext4 block.
	upload(t, srv, filepath.Join(dir, "large"), "x",
		"X-Metadata-A", strings.Repeat("v", 1400), "X-Metadata-B", strings.Repeat("v", 1400), "X-Metadata-C", strings.Repeat("v", 900))
	cases := map[string][]string{
		"non-ASCII value": {"X-Metadata-Name", "caf\xc3\xa9"},
		"tab in a value":  {"X-Metadata-Name", "a\tb"},
		"key of 247":      {"X-Metadata-" + strings.Repeat("k", 247), "v"},
		"over 4096 bytes": {"X-Metadata-A", strings.Repeat("v", 1400), "X-Metadata-B", strings.Repeat("v", 1400),
			"X-Metadata-C", strings.Repeat("v", 1300)},
	}
	for name, hdr := range cases {
		req, _ := http.NewRequest(http.MethodPost, fileURL(srv, p), strings.NewReader("replaced"))
		req.Header.Set("Content-Type", "application/octet-stream")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, b := do(t, req)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, resp.StatusCode, b)
		}
		if got, _ := os.ReadFile(p); string(got) != "original" {
			t.Errorf("%s: the refused upload changed the file to %q", name, got)
		}
		if got := xattrs(t, p); !maps.Equal(got, map[string]string{"kept": "yes"}) {
			t.Errorf("%s: the refused upload changed the metadata to %v", name, got)
		}
	}
}
