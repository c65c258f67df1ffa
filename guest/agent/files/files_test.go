package files_test

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agenttest"
	"github.com/agentenv/agentenv/guest/agent/files"
	"github.com/agentenv/agentenv/guest/agent/state"
)

func fileURL(srv *agenttest.Server, path string, extra ...string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return srv.URL + "/files?" + q.Encode()
}

func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := agenttest.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func get(t *testing.T, u string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func postRaw(t *testing.T, u string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, body)
	req.Header.Set("Content-Type", "application/octet-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

// multipartBody builds a multipart body with one "file" part per name/content pair.
func multipartBody(t *testing.T, parts ...string) (io.Reader, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(parts); i += 2 {
		w, err := mw.CreateFormFile("file", parts[i])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(parts[i+1]))
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

func decodeEntries(t *testing.T, b []byte) []files.Entry {
	t.Helper()
	var es []files.Entry
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return es
}

func TestUploadAndDownload(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	dir := t.TempDir()

	t.Run("octet-stream creates parents", func(t *testing.T) {
		p := filepath.Join(dir, "raw", "deep", "a.txt")
		resp, b := postRaw(t, fileURL(srv, p), strings.NewReader("raw body"))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		es := decodeEntries(t, b)
		if len(es) != 1 || es[0].Path != p || es[0].Name != "a.txt" || es[0].Type != "file" {
			t.Fatalf("entries %+v", es)
		}
		if got, _ := os.ReadFile(p); string(got) != "raw body" {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("octet-stream gzip-encoded and overwrite", func(t *testing.T) {
		p := filepath.Join(dir, "gz.txt")
		os.WriteFile(p, []byte("old content that is longer"), 0o644)
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		zw.Write([]byte("unzipped"))
		zw.Close()
		resp, b := postRaw(t, fileURL(srv, p), &zb, "Content-Encoding", "gzip")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if got, _ := os.ReadFile(p); string(got) != "unzipped" {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("multipart single file to query path", func(t *testing.T) {
		p := filepath.Join(dir, "mp.txt")
		body, ct := multipartBody(t, "ignored-name.txt", "multipart body")
		resp, b := postRaw(t, fileURL(srv, p), body, "Content-Type", ct)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if got, _ := os.ReadFile(p); string(got) != "multipart body" {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("multipart many files named by full path", func(t *testing.T) {
		p1, p2 := filepath.Join(dir, "many", "one"), filepath.Join(dir, "many", "sub", "two")
		body, ct := multipartBody(t, p1, "1", p2, "2")
		resp, b := postRaw(t, fileURL(srv, ""), body, "Content-Type", ct)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if es := decodeEntries(t, b); len(es) != 2 || es[0].Path != p1 || es[1].Path != p2 {
			t.Fatalf("entries %+v", es)
		}
		for p, want := range map[string]string{p1: "1", p2: "2"} {
			if got, _ := os.ReadFile(p); string(got) != want {
				t.Fatalf("%s: %q", p, got)
			}
		}
	})
	t.Run("relative path lands in home", func(t *testing.T) {
		resp, b := postRaw(t, fileURL(srv, "notes/r.txt"), strings.NewReader("r"))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if es := decodeEntries(t, b); es[0].Path != filepath.Join(srv.Home, "notes", "r.txt") {
			t.Fatalf("entries %+v", es)
		}
		resp, b = get(t, fileURL(srv, "notes/r.txt"))
		if resp.StatusCode != 200 || string(b) != "r" {
			t.Fatalf("download %d %q", resp.StatusCode, b)
		}
	})
	t.Run("download range, gzip, head", func(t *testing.T) {
		p := filepath.Join(dir, "digits")
		os.WriteFile(p, []byte("0123456789"), 0o644)
		resp, b := get(t, fileURL(srv, p), "Range", "bytes=2-5")
		if resp.StatusCode != http.StatusPartialContent || string(b) != "2345" {
			t.Fatalf("range: %d %q", resp.StatusCode, b)
		}
		// Setting Accept-Encoding ourselves turns off the transport's transparent decoding.
		resp, b = get(t, fileURL(srv, p), "Accept-Encoding", "gzip")
		if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("gzip: %d %v", resp.StatusCode, resp.Header)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if plain, _ := io.ReadAll(zr); string(plain) != "0123456789" {
			t.Fatalf("gunzipped %q", plain)
		}
		resp, b = get(t, fileURL(srv, p), "Accept-Encoding", "identity")
		if resp.StatusCode != 200 || string(b) != "0123456789" || resp.Header.Get("Content-Length") != "10" {
			t.Fatalf("plain: %d %q %v", resp.StatusCode, b, resp.Header)
		}
		if !strings.Contains(resp.Header.Get("Content-Disposition"), "digits") {
			t.Fatalf("content-disposition %q", resp.Header.Get("Content-Disposition"))
		}
	})
}

func TestErrors(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	dir := t.TempDir()
	tests := []struct {
		name   string
		method string
		url    string
		body   string
		ctype  string
		status int
	}{
		{"download missing", "GET", fileURL(srv, filepath.Join(dir, "nope")), "", "", 404},
		{"download directory", "GET", fileURL(srv, dir), "", "", 400},
		{"download without path", "GET", fileURL(srv, ""), "", "", 400},
		{"download unknown user", "GET", fileURL(srv, dir, "username", "no-such-user-aenv"), "", "", 401},
		{"upload onto a directory", "POST", fileURL(srv, dir), "x", "application/octet-stream", 400},
		{"raw upload without path", "POST", fileURL(srv, ""), "x", "application/octet-stream", 400},
		{"bad multipart", "POST", fileURL(srv, filepath.Join(dir, "m")), "garbage", "multipart/form-data; boundary=zzz", 400},
		{"multipart without file part", "POST", fileURL(srv, filepath.Join(dir, "m")), "--zzz--\r\n", "multipart/form-data; boundary=zzz", 400},
		{"bad gzip", "POST", fileURL(srv, filepath.Join(dir, "g")), "not gzip", "application/octet-stream", 400},
		{"method", "DELETE", fileURL(srv, dir), "", "", 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			if tc.name == "bad gzip" {
				req.Header.Set("Content-Encoding", "gzip")
			}
			resp, b := do(t, req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Code != tc.status || e.Message == "" {
				t.Fatalf("error body %q (%v)", b, err)
			}
		})
	}
}

func TestSign(t *testing.T) {
	t.Parallel()
	// Vectors computed with coreutils: printf %s 'p:read:u:tok' | sha256sum | xxd -r -p | base64 | tr -d =
	exp := int64(1700000000)
	if got := files.Sign("p", "read", "u", "tok", nil); got != "v1_uLeBXxspXQ0FHnFzmxifVqv703ud6HZg5rdly074EdA" {
		t.Fatalf("Sign = %s", got)
	}
	if got := files.Sign("p", "write", "", "tok", &exp); got != "v1_MDYjA4Mkt8OSU5zc4ODHeXXtWCVU5M5l6kWqqxUH+jc" {
		t.Fatalf("Sign with expiration = %s", got)
	}
}

func TestAccessTokenAndSignatures(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	const token = "secret-token"
	tok := token
	srv.Agent.State().Apply(state.Settings{AccessToken: &tok})
	p := filepath.Join(t.TempDir(), "s.txt")
	os.WriteFile(p, []byte("signed"), 0o644)
	future := time.Now().Add(time.Hour).Unix()
	past := time.Now().Add(-time.Minute).Unix()
	sig := func(op, user string, exp *int64) string { return files.Sign(p, op, user, token, exp) }
	tests := []struct {
		name   string
		extra  []string
		hdr    []string
		status int
	}{
		{"no credentials", nil, nil, 401},
		{"wrong token", nil, []string{"X-Access-Token", "nope"}, 401},
		{"token header", nil, []string{"X-Access-Token", token}, 200},
		{"signature", []string{"signature", sig("read", "", nil)}, nil, 200},
		{"signature with user", []string{"signature", sig("read", "root", nil), "username", "root"}, nil, 200},
		{"signature for another user", []string{"signature", sig("read", "", nil), "username", "root"}, nil, 401},
		{"write signature used to read", []string{"signature", sig("write", "", nil)}, nil, 401},
		{"unexpired signature", []string{"signature", sig("read", "", &future), "signature_expiration", strconv.FormatInt(future, 10)}, nil, 200},
		{"expired signature", []string{"signature", sig("read", "", &past), "signature_expiration", strconv.FormatInt(past, 10)}, nil, 401},
		{"expiration stripped", []string{"signature", sig("read", "", &future)}, nil, 401},
		{"bad expiration", []string{"signature", sig("read", "", nil), "signature_expiration", "soon"}, nil, 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "signature with user" && os.Geteuid() != 0 {
				t.Skip("reading as root needs root")
			}
			resp, b := get(t, fileURL(srv, p, tc.extra...), tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 200 && string(b) != "signed" {
				t.Fatalf("body %q", b)
			}
		})
	}
	t.Run("expiry answers in E2B's words, only to the signature's holder", func(t *testing.T) {
		for _, c := range []struct{ sig, msg string }{{sig("read", "", &past), "signature is already expired"}, {"v1_forged", "invalid signature"}} {
			resp, b := get(t, fileURL(srv, p, "signature", c.sig, "signature_expiration", strconv.FormatInt(past, 10)))
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(b, &body); err != nil || resp.StatusCode != 401 || body.Code != 401 || body.Message != c.msg {
				t.Errorf("status %d body %s (%v), want 401 {code:401, message:%q}", resp.StatusCode, b, err, c.msg)
			}
		}
	})
	t.Run("signed upload", func(t *testing.T) {
		up := filepath.Join(filepath.Dir(p), "up.txt")
		u := fileURL(srv, up, "signature", files.Sign(up, "write", "", token, nil))
		resp, b := postRaw(t, u, strings.NewReader("uploaded"))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		resp, _ = postRaw(t, fileURL(srv, up, "signature", files.Sign(up, "read", "", token, nil)), strings.NewReader("x"))
		if resp.StatusCode != 401 {
			t.Fatalf("read signature accepted for an upload: %d", resp.StatusCode)
		}
	})
}

// TestSignatureBindsItsUser: a URL signed for one user acts as that user
// only (the owner of what it writes, the home its relative paths resolve
// in). An unsigned Basic auth header naming another user used to be obeyed,
// so a link signed for nobody wrote root's files.
func TestSignatureBindsItsUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("acting as another user needs root")
	}
	srv := agenttest.Start(t)
	const token = "secret-token"
	tok := token
	srv.Agent.State().Apply(state.Settings{AccessToken: &tok})
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	basic := func(user string) []string {
		return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))}
	}
	signedUpload := func(name, user string, hdr ...string) (int, []byte) {
		p := filepath.Join(dir, name)
		q := []string{"signature", files.Sign(p, "write", user, token, nil)}
		if user != "" {
			q = append(q, "username", user)
		}
		resp, b := postRaw(t, fileURL(srv, p, q...), strings.NewReader("x"), hdr...)
		return resp.StatusCode, b
	}
	for _, c := range []struct{ name, signedFor, basic string }{
		{"for-nobody-basic-root", "nobody", "root"},
		{"for-default-basic-nobody", "", "nobody"}, // the default user is "tester" (uid 0) here
		{"for-default-basic-root", "", "root"},
	} {
		if status, b := signedUpload(c.name, c.signedFor, basic(c.basic)...); status != http.StatusUnauthorized {
			fi, _ := os.Stat(filepath.Join(dir, c.name))
			t.Errorf("%s: status %d (%s), want 401; file: %v", c.name, status, b, owner(fi))
		}
		if _, err := os.Stat(filepath.Join(dir, c.name)); err == nil {
			t.Errorf("%s: the refused upload wrote its file", c.name)
		}
	}
	// The signed user, in the header too or not at all, is what SDKs send.
	for _, c := range []struct {
		name, signedFor string
		hdr             []string
		uid             uint32
	}{
		{"nobody-alone", "nobody", nil, 65534},
		{"nobody-basic-nobody", "nobody", basic("nobody"), 65534},
		{"default-basic-tester", "", basic("tester"), 0},
	} {
		if status, b := signedUpload(c.name, c.signedFor, c.hdr...); status != http.StatusOK {
			t.Fatalf("%s: status %d (%s), want 200", c.name, status, b)
		}
		fi, err := os.Stat(filepath.Join(dir, c.name))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != c.uid {
			t.Fatalf("%s: %v %v, want owner uid %d", c.name, owner(fi), err, c.uid)
		}
	}
	t.Run("a signature binds a path", func(t *testing.T) {
		up := filepath.Join(dir, "elsewhere.txt")
		body, ct := multipartBody(t, up, "x")
		u := srv.URL + "/files?signature=" + url.QueryEscape(files.Sign("", "write", "", token, nil))
		resp, b := postRaw(t, u, body, "Content-Type", ct)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("multipart upload signed for no path: status %d (%q), want 401", resp.StatusCode, b)
		}
		if _, err := os.Stat(up); err == nil {
			t.Fatal("a signature for no path wrote a file the parts named")
		}
	})
}

func owner(fi os.FileInfo) string {
	if fi == nil {
		return "none"
	}
	return fmt.Sprintf("uid %d", fi.Sys().(*syscall.Stat_t).Uid)
}

func TestUploadAsOtherUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	srv := agenttest.Start(t)
	p := filepath.Join(t.TempDir(), "new", "owned.txt")
	resp, b := postRaw(t, fileURL(srv, p, "username", "nobody"), strings.NewReader("x"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	for _, q := range []string{p, filepath.Dir(p)} {
		var st syscall.Stat_t
		if err := syscall.Stat(q, &st); err != nil || st.Uid != 65534 {
			t.Fatalf("%s owned by %d (%v), want 65534", q, st.Uid, err)
		}
	}
}

// TestDiskFull: an upload that does not fit answers 507.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	srv := agenttest.Start(t)
	resp, b := postRaw(t, fileURL(srv, filepath.Join(mnt, "big")), io.LimitReader(zeros{}, 4<<20))
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("status %d, want 507: %s", resp.StatusCode, b)
	}
	if _, err := os.Stat(filepath.Join(mnt, "big")); !os.IsNotExist(err) {
		t.Fatalf("partial upload left behind: %v", err)
	}
}

// raceEnabled is set by race_test.go when the race detector is on.
var raceEnabled bool

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// pattern is a deterministic, non-repeating-at-block-size byte stream.
type pattern struct{ off int64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		x := uint64(p.off + int64(i))
		b[i] = byte(x ^ x>>8 ^ x>>19)
	}
	p.off += int64(len(b))
	return len(b), nil
}

// TestOneGiBStreamedWithBoundedMemory uploads 1 GiB (multipart) and
// downloads it back, checking content by hash and that the process
// allocated a small fraction of the file's size along the way.
func TestOneGiBStreamedWithBoundedMemory(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("-short or -race: moving 1 GiB under the race detector takes minutes")
	}
	const size = 1 << 30
	srv := agenttest.Start(t)
	p := filepath.Join(t.TempDir(), "big.bin")

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	want := sha256.New()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		w, err := mw.CreateFormFile("file", "big.bin")
		if err == nil {
			_, err = io.Copy(w, io.TeeReader(io.LimitReader(&pattern{}, size), want))
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	resp, b := postRaw(t, fileURL(srv, p), pr, "Content-Type", mw.FormDataContentType())
	if resp.StatusCode != 200 {
		t.Fatalf("upload status %d: %s", resp.StatusCode, b)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != size {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}

	dresp, err := agenttest.Client.Get(fileURL(srv, p))
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, dresp.Body)
	dresp.Body.Close()
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("downloaded content differs from the upload")
	}

	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Client and server share this process: 2 GiB moved through it in total.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Fatalf("allocated %d MiB to move 1 GiB up and down: not streamed", alloc>>20)
	}
	t.Logf("heap allocations for 1 GiB up + down: %.1f MiB", float64(after.TotalAlloc-before.TotalAlloc)/(1<<20))
	os.Remove(p)
}
