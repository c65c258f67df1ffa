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
