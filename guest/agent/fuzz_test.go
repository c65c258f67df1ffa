package agent_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// FuzzInit feeds arbitrary bodies to POST /init: never a panic, only 204 or 400.
func FuzzInit(f *testing.F) {
	f.Add([]byte(`{"accessToken":"t","envVars":{"a":"b"},"timestamp":"2024-01-01T00:00:00Z","defaultUser":"root","defaultWorkdir":"/"}`))
	f.Add([]byte(`{"envVars":null}`))
	f.Add([]byte(`{`))
	db := &users.DB{PasswdPath: "/etc/passwd", GroupPath: "/etc/group"}
	f.Fuzz(func(t *testing.T, body []byte) {
		a := agent.New(agent.Config{SkipInitDuties: true, Users: db})
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/init", bytes.NewReader(body)))
		if rec.Code != http.StatusNoContent && rec.Code != http.StatusBadRequest {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}
