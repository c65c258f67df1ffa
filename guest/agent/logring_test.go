package agent

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestLogRing(t *testing.T) {
	r := NewLogRing()
	fmt.Fprint(r, "one\ntw")
	fmt.Fprint(r, "o\n")
	if got := r.Lines(); len(got) != 2 || string(got[0]) != "one" || string(got[1]) != "two" {
		t.Fatalf("lines %q", got)
	}
	for i := range logRingLines + 5 {
		fmt.Fprintf(r, "line %d\n", i)
	}
	got := r.Lines()
	if len(got) != logRingLines || string(got[0]) != "line 5" || string(got[len(got)-1]) != fmt.Sprintf("line %d", logRingLines+4) {
		t.Fatalf("after overflow: %d lines, first %q last %q", len(got), got[0], got[len(got)-1])
	}
	fmt.Fprint(r, strings.Repeat("x", 3*logRingLineLen)+"\n")
	if l := r.Lines(); len(l[len(l)-1]) != logRingLineLen {
		t.Errorf("a long line kept %d bytes, want %d", len(l[len(l)-1]), logRingLineLen)
	}

	a := New(Config{Logs: r})
	w := httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest("GET", "/logs", nil))
	body, _ := io.ReadAll(w.Body)
	if w.Code != 200 || !strings.Contains(string(body), fmt.Sprintf("line %d\n", logRingLines+4)) {
		t.Errorf("GET /logs: %d, %d bytes", w.Code, len(body))
	}
}
