// Package files serves the agent's /files endpoint: GET streams a file to
// the client (with Range and gzip), POST streams one or more uploads
// (multipart or raw octet-stream, optionally gzip-encoded) to disk without
// ever holding a whole file in memory. It also owns the signed-URL rule that
// lets a client without the access token read or write one path.
package files

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/guest/agent/fssvc"
	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// copyBuf is the size of the buffer between the network and the disk.
const copyBuf = 1 << 20

// Handler serves GET and POST /files.
type Handler struct {
	st  *state.State
	log *slog.Logger
	now func() time.Time
}

// New returns the handler.
func New(st *state.State, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	return &Handler{st: st, log: log, now: time.Now}
}

// Entry is one element of the upload response (E2B's EntryInfo).
type Entry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
	// Metadata is the file's user metadata as the upload stored it.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// ServeHTTP dispatches on the method.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.download(w, r)
	case http.MethodPost, http.MethodPut:
		h.upload(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// Sign computes the signature of a signed /files URL: "v1_" and the
// unpadded standard base64 of SHA-256 over path:operation:username:token,
// with ":expiration" appended when the URL expires.
func Sign(path, operation, username, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + username + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// grant is what a request's credentials allow: everything (the access
// token, or no token set), or one signed operation on one path for one user.
type grant struct {
	signed bool
	user   string // the user named in the signature ("" = the default user)
}

// authorize applies the access rule of /files: no token set, the token in
// the header, or a valid unexpired signature for this path, operation and user.
func (h *Handler) authorize(r *http.Request, operation string) (grant, error) {
	tok := h.st.Token()
	if tok == "" || state.TokenEqual(r.Header.Get(state.AccessTokenHeader), tok) {
		return grant{}, nil
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return grant{}, errors.New("missing access token or signature")
	}
	if q.Get("path") == "" {
		// A signature binds one path: without it a multipart upload would
		// name its targets itself.
		return grant{}, errors.New("a signed request must name its path")
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return grant{}, fmt.Errorf("bad signature_expiration %q", v)
		}
		exp = &n
	}
	// The signature first: only its holder learns that it expired.
	if !state.TokenEqual(sig, Sign(q.Get("path"), operation, q.Get("username"), tok, exp)) {
		return grant{}, errors.New("invalid signature")
	}
	if exp != nil && *exp < h.now().Unix() {
		return grant{}, errors.New("signature is already expired") // E2B's agent's words, which its SDK users match
	}
	return grant{signed: true, user: q.Get("username")}, nil
}

// user picks the user of a /files request: ?username=, else Basic auth, else
// the default. A signed request acts as the user it was signed for: an
// unsigned Basic auth header naming anyone else is refused, not obeyed.
func (h *Handler) user(r *http.Request, g grant) (*users.User, error) {
	if g.signed {
		u, err := h.st.User(g.user)
		if err != nil {
			return nil, err
		}
		if name, ok, err := state.BasicUser(r.Header); err != nil || (ok && name != u.Name) {
			return nil, fmt.Errorf("the signature is for user %q, not the one in the Authorization header", u.Name)
		}
		return u, nil
	}
	if name := r.URL.Query().Get("username"); name != "" {
		return h.st.User(name)
	}
	return h.st.RequestUser(r.Header)
}

// access authorizes a request for operation and resolves its user; on
// failure it has answered 401.
func (h *Handler) access(w http.ResponseWriter, r *http.Request, operation string) (*users.User, bool) {
	g, err := h.authorize(r, operation)
	if err == nil {
		var u *users.User
		if u, err = h.user(r, g); err == nil {
			return u, true
		}
	}
	writeError(w, http.StatusUnauthorized, err.Error())
	return nil, false
}

func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	u, ok := h.access(w, r, "read")
	if !ok {
		return
	}
	raw := r.URL.Query().Get("path")
	if raw == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return
	}
	path, err := state.ResolvePath(u, raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeFSError(w, "open "+path, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeFSError(w, "stat "+path, err)
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s is a directory", path))
		return
	}
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(path)}))
	if wantsGzip(r) {
		h.sendGzip(w, r, f)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	// ServeContent answers Range and conditional requests from the open file.
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// wantsGzip: compress when the client accepts gzip and did not ask for a range
// (ranges address the raw bytes).
func wantsGzip(r *http.Request) bool {
	if r.Header.Get("Range") != "" || r.Method == http.MethodHead {
		return false
	}
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(enc, "gzip") {
			return true
		}
	}
	return false
}

func (h *Handler) sendGzip(w http.ResponseWriter, r *http.Request, f *os.File) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	w.WriteHeader(http.StatusOK)
	// Fastest level: browsers and fetch() ask for gzip by default, and the
	// guest's CPU is the sandbox's own.
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if _, err := io.CopyBuffer(zw, f, make([]byte, copyBuf)); err != nil {
		h.log.Debug("files: gzip download aborted", "path", f.Name(), "err", err)
		return
	}
	_ = zw.Close()
}

func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	u, ok := h.access(w, r, "write")
	if !ok {
		return
	}
	md, err := metadata(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	queryPath := r.URL.Query().Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var entries []Entry
	if ct == "multipart/form-data" {
		entries, err = h.uploadMultipart(r, u, queryPath, md)
	} else {
		var e Entry
		e, err = h.uploadRaw(r, u, queryPath, md)
		entries = []Entry{e}
	}
	if err != nil {
		writeUploadError(w, err)
		return
	}
	if len(entries) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the request")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(entries)
}

func (h *Handler) uploadRaw(r *http.Request, u *users.User, raw string, md map[string]string) (Entry, error) {
	if raw == "" {
		return Entry{}, badRequest("path is required for an octet-stream upload")
	}
	body, err := decoded(r.Body, r.Header.Get("Content-Encoding"))
	if err != nil {
		return Entry{}, err
	}
	return h.store(u, raw, body, md)
}

func (h *Handler) uploadMultipart(r *http.Request, u *users.User, queryPath string, md map[string]string) ([]Entry, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, badRequest("read multipart body: " + err.Error())
	}
	var entries []Entry
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			return nil, badRequest("read multipart body: " + err.Error())
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := queryPath
		if target == "" {
			// Part.FileName keeps only the base name; the SDK sends the whole
			// destination path as the file name of each part.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			target = params["filename"]
		}
		if target == "" {
			part.Close()
			return nil, badRequest("a file part has no path")
		}
		e, err := h.store(u, target, part, md)
		part.Close()
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
}

// store streams body into the file at raw (resolved for u), creating
// parent directories and giving new things to u.
func (h *Handler) store(u *users.User, raw string, body io.Reader, md map[string]string) (Entry, error) {
	path, err := state.ResolvePath(u, raw)
	if err != nil {
		return Entry{}, badRequest(err.Error())
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return Entry{}, badRequest(path + " is a directory")
	}
	if err := fssvc.MkdirAllOwned(filepath.Dir(path), u); err != nil {
		return Entry{}, fmt.Errorf("create parent of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return Entry{}, fmt.Errorf("open %s: %w", path, err)
	}
	_, err = io.CopyBuffer(onlyWriter{f}, body, make([]byte, copyBuf))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A partial file is useless, and on a full disk it holds the space.
		os.Remove(path)
		return Entry{}, fmt.Errorf("write %s: %w", path, err)
	}
	if err := fssvc.Chown(path, u); err != nil {
		return Entry{}, err
	}
	e := Entry{Path: path, Name: filepath.Base(path), Type: "file"}
	// The upload replaces the metadata the file had (O_TRUNC keeps xattrs).
	switch err := fssvc.ReplaceMetadata(path, md); {
	case errors.Is(err, syscall.ENOTSUP): // a filesystem without xattrs keeps none
	case err != nil:
		return Entry{}, err
	case len(md) > 0:
		e.Metadata = md
	}
	return e, nil
}

// onlyWriter hides os.File's ReadFrom so that io.CopyBuffer uses our buffer
// (one allocation per upload) instead of allocating its own per call.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

func decoded(body io.Reader, encoding string) (io.Reader, error) {
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, badRequest("read gzip body: " + err.Error())
		}
		return zr, nil
	default:
		return nil, &httpError{status: http.StatusUnsupportedMediaType, msg: "unsupported Content-Encoding " + encoding}
	}
}

// Limits of E2B's agent on upload metadata: a key fills an xattr name
// (255 bytes) with the prefix; all of a file's metadata, the prefix counted
// per key, stays within a filesystem's per-inode xattr budget.
const (
	metadataHeader   = "X-Metadata-"
	maxMetadataKey   = 255 - len(fssvc.MetadataXattrPrefix)
	maxMetadataBytes = 4096
)

// metadata collects X-Metadata-<key> headers the way E2B's agent does: the
// key lowercased, the first value of a repeated header; keys and values of
// printable US-ASCII within the limits above, else a client error.
func metadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for k, v := range h {
		if len(k) <= len(metadataHeader) || !strings.EqualFold(k[:len(metadataHeader)], metadataHeader) || len(v) == 0 {
			continue
		}
		key, val := strings.ToLower(k[len(metadataHeader):]), v[0]
		if !printableASCII(key) || !printableASCII(val) {
			return nil, fmt.Errorf("metadata %q: keys and values must be printable US-ASCII", key)
		}
		if len(key) > maxMetadataKey {
			return nil, fmt.Errorf("metadata key %.32q...: longer than %d bytes", key, maxMetadataKey)
		}
		if md == nil {
			md = map[string]string{}
		}
		if _, dup := md[key]; dup {
			continue
		}
		md[key] = val
		if total += len(fssvc.MetadataXattrPrefix) + len(key) + len(val); total > maxMetadataBytes {
			return nil, fmt.Errorf("metadata: more than %d bytes with the %q prefix of each key", maxMetadataBytes, fssvc.MetadataXattrPrefix)
		}
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(msg string) error { return &httpError{status: http.StatusBadRequest, msg: msg} }

func writeUploadError(w http.ResponseWriter, err error) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		writeError(w, he.status, he.msg)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		writeError(w, http.StatusInsufficientStorage, "not enough disk space: "+err.Error())
	default:
		writeFSError(w, "upload", err)
	}
}

func writeFSError(w http.ResponseWriter, op string, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		status = http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		status = http.StatusForbidden
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		status = http.StatusBadRequest
	case errors.Is(err, syscall.ENOSPC):
		status = http.StatusInsufficientStorage
	}
	writeError(w, status, fmt.Sprintf("%s: %v", op, err))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Encoding")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}
