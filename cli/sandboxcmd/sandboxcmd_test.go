package sandboxcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The real aenvd has no fork or snapshot routes yet; these tests pin the
// commands' output against the documented API.
func fake(t *testing.T) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		fmt.Fprint(w, `[{"sandbox":{"sandboxID":"kid1","templateID":"base"}},{"error":{"code":507,"message":"no capacity left"}}]`)
	})
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		fmt.Fprint(w, `{"snapshotID":"snap1","names":["mine"]}`)
	})
	mux.HandleFunc("GET /snapshots", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `[{"snapshotID":"snap1","names":["mine"],"sandboxID":"p"}]`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
}

func run(args ...string) (string, error) {
	root := &cobra.Command{Use: "aenv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(Commands()...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestFork(t *testing.T) {
	fake(t)
	out, err := run("fork", "p", "--count", "2")
	if err == nil || !strings.Contains(err.Error(), "1 of 2 children failed") {
		t.Fatalf("fork with a failed child: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SANDBOX ID") || !strings.HasPrefix(lines[1], "kid1 ") || !strings.Contains(lines[2], "no capacity left") {
		t.Fatalf("fork table:\n%s", out)
	}
	out, _ = run("fork", "p", "--count", "2", "-o", "json")
	var res []map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res) != 2 || res[0]["sandbox"] == nil || res[1]["error"] == nil {
		t.Fatalf("fork json %v:\n%s", err, out)
	}
}

func TestSnapshot(t *testing.T) {
	fake(t)
	out, err := run("snapshot", "create", "p", "--name", "mine")
	if err != nil || !strings.Contains(out, "SNAPSHOT ID") || !strings.Contains(out, "snap1") || !strings.Contains(out, "mine") {
		t.Fatalf("snapshot create: %v\n%s", err, out)
	}
	out, err = run("snapshot", "list", "-o", "json")
	var snaps []struct{ SnapshotID, SandboxID string }
	if err != nil || json.Unmarshal([]byte(out), &snaps) != nil || len(snaps) != 1 || snaps[0].SandboxID != "p" {
		t.Fatalf("snapshot list -o json: %v\n%s", err, out)
	}
	out, err = run("snapshot", "list")
	if err != nil || !strings.Contains(out, "SANDBOX ID") || !strings.Contains(out, "snap1") {
		t.Fatalf("snapshot list: %v\n%s", err, out)
	}
}

func TestSeconds(t *testing.T) {
	for in, want := range map[string]int32{"": 0, "90": 90, "5m": 300, "1h30m": 5400, "1.5s": 2} {
		if got, err := seconds(in); err != nil || got != want {
			t.Errorf("seconds(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "soon", "-5m"} {
		if _, err := seconds(in); err == nil {
			t.Errorf("seconds(%q) accepted", in)
		}
	}
	var exit *ExitError
	if !errors.As(error(&ExitError{Code: 3}), &exit) || exit.Code != 3 {
		t.Fatal("ExitError")
	}
}

// TestStartSecureByDefault: `aenv start` asks for a secure sandbox unless
// told --secure=false, and says so either way (the v1 API's default is
// not secure).
func TestStartSecureByDefault(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--secure=false"}, false}, {[]string{"--secure"}, true}} {
		cmd := startCmd()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		var f startFlags
		f.secure, _ = cmd.Flags().GetBool("secure")
		f.timeout = "5m"
		req, err := f.request("base")
		if err != nil {
			t.Fatal(err)
		}
		if req.Secure == nil || *req.Secure != c.want {
			t.Errorf("start %v: secure %v, want %v sent", c.args, req.Secure, c.want)
		}
	}
}
