package files_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/guest/agent/files"
	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// FuzzUploadMultipart sends arbitrary multipart bodies; the handler must
// answer (never panic) and write only below the target directory.
func FuzzUploadMultipart(f *testing.F) {
	f.Add("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\nhello\r\n--b--\r\n", "b")
	f.Add("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b/c\"\r\n\r\n\r\n--b--\r\n", "b")
	f.Add("--b\r\n\r\n--b--", "b")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, body, boundary string) {
		dir := t.TempDir()
		home := filepath.Join(dir, "home")
		os.Mkdir(home, 0o755)
		db := &users.DB{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
		os.WriteFile(db.PasswdPath, []byte("tester:x:"+itoa(os.Getuid())+":"+itoa(os.Getgid())+"::"+home+":/bin/sh\n"), 0o644)
		h := files.New(state.New(db, "tester"), nil)
		req := httptest.NewRequest(http.MethodPost, "/files?path="+url.QueryEscape(filepath.Join(home, "t")), bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 && (rec.Code < 400 || rec.Code > 599) {
			t.Fatalf("status %d", rec.Code)
		}
		if rec.Code == 200 && !strings.HasPrefix(rec.Body.String(), "[") {
			t.Fatalf("200 without entries: %q", rec.Body.String())
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// FuzzUploadMetadata sends an upload with an arbitrary X-Metadata-* header:
// the handler answers 200 or 400, and what it stores is printable ASCII.
func FuzzUploadMetadata(f *testing.F) {
	f.Add("Purpose", "test")
	f.Add("K", "caf\xc3\xa9")
	f.Add(strings.Repeat("k", 247), "v")
	f.Add("a", strings.Repeat("v", 5000))
	f.Fuzz(func(t *testing.T, key, value string) {
		dir := t.TempDir()
		db := &users.DB{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
		os.WriteFile(db.PasswdPath, []byte("tester:x:"+itoa(os.Getuid())+":"+itoa(os.Getgid())+"::"+dir+":/bin/sh\n"), 0o644)
		h := files.New(state.New(db, "tester"), nil)
		req := httptest.NewRequest(http.MethodPost, "/files?path="+url.QueryEscape(filepath.Join(dir, "t")), strings.NewReader("x"))
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header["X-Metadata-"+key] = []string{value}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 && rec.Code != 400 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if rec.Code == 200 && strings.ContainsFunc(rec.Body.String(), func(r rune) bool { return r < 0x20 && r != '\n' || r > 0x7e }) {
			t.Fatalf("stored metadata is not printable ASCII: %q", rec.Body.String())
		}
	})
}
