package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// A template files upload URL (GET /templates/{id}/files/{hash}) carries
// an upload token in its query: E2B's SDK PUTs the archive to that URL as
// it is, with no X-API-Key. The token is an HMAC under the node's API key
// of the template id and files key, so it grants only the upload of the
// one archive stored under that key, which is written once and never
// replaced (template/files.go).
const uploadTokenParam = "token"

// uploadToken is the token of the upload of hash to templateID.
func uploadToken(apiKey, templateID, hash string) string {
	m := hmac.New(sha256.New, []byte(apiKey))
	m.Write([]byte("template-files\x00" + templateID + "\x00" + hash))
	return hex.EncodeToString(m.Sum(nil))
}

// uploadAuthorized reports whether r is a template files upload whose
// query carries the valid upload token.
func uploadAuthorized(r *http.Request, apiKey string) bool {
	if r.Method != http.MethodPut || apiKey == "" {
		return false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/templates/")
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[1] != "files" || parts[0] == "" || parts[2] == "" {
		return false
	}
	tok := r.URL.Query().Get(uploadTokenParam)
	want := uploadToken(apiKey, parts[0], parts[2])
	return tok != "" && hmac.Equal([]byte(tok), []byte(want))
}
