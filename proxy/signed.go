package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
)

// Lister is implemented by Sandboxes that can name every sandbox: with it
// the proxy routes a signed /files URL that names no sandbox (the form the
// SDK's downloadUrl/uploadUrl take when E2B_SANDBOX_URL is set) to the
// sandbox whose access token signed it.
type Lister interface {
	IDs() []string
}

// maxSignedScan bounds the sandboxes tried for one signed URL.
const maxSignedScan = 4096

// bySignature finds the sandbox a signed /files request was signed for;
// ok is false when the request is not one or no sandbox's token signed it.
func (p *Proxy) bySignature(r *http.Request) (target, bool) {
	l, ok := p.o.(Lister)
	if !ok || r.URL.Path != "/files" {
		return target{}, false
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return target{}, false
	}
	operation := "read"
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		operation = "write"
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return target{}, false
		}
		exp = &n
	}
	ids := l.IDs()
	if len(ids) > maxSignedScan {
		ids = ids[:maxSignedScan]
	}
	for _, id := range ids {
		rec, err := p.o.Get(id)
		if err != nil || rec.AccessToken == "" || rec.Killing {
			continue
		}
		want := signFiles(q.Get("path"), operation, q.Get("username"), rec.AccessToken, exp)
		if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1 {
			return target{id: id, port: AgentPort}, true
		}
	}
	return target{}, false
}

// signFiles is the agent's /files signature (guest/agent/files.Sign):
// "v1_" and the unpadded standard base64 of SHA-256 over
// path:operation:username:token, with ":expiration" when it expires.
func signFiles(path, operation, username, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + username + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
