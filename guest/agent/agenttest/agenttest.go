// Package agenttest starts a real aenv-agent server inside a test process,
// on a free loopback port, with an optional private passwd/group database so
// that tests can define users whose home directories they own.
package agenttest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// Server is a running agent.
type Server struct {
	URL   string
	Agent *agent.Agent
	// Home is the home directory of the test user "tester" (same uid/gid as
	// the test process), the agent's default user.
	Home string
}

// Start runs an agent until the test ends. Its default user is "tester",
// who is the test process's own uid with a temporary home; "nobody" and
// "root" come from the machine's /etc/passwd.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, "", "")
}

// StartWith is Start with extra passwd and group lines.
func StartWith(t testing.TB, extraPasswd, extraGroup string) *Server {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "home", "tester")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	db := WriteUsers(t, dir, home, extraPasswd, extraGroup)
	a := agent.New(agent.Config{DefaultUser: "tester", SkipInitDuties: true, Users: db})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = agent.ServeListener(ctx, ln, a)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return &Server{URL: "http://" + ln.Addr().String(), Agent: a, Home: home}
}

// WriteUsers writes passwd and group files into dir: the machine's own
// entries plus "tester" (this process's uid and gid, home at home) and the
// extra lines given.
func WriteUsers(t testing.TB, dir, home, extraPasswd, extraGroup string) *users.DB {
	t.Helper()
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	// Appended, so that the machine's own name for this uid (e.g. root) stays the first match.
	if len(passwd) > 0 && passwd[len(passwd)-1] != '\n' {
		passwd = append(passwd, '\n')
	}
	passwd = append(passwd, fmt.Sprintf("tester:x:%d:%d:Tester:%s:/bin/sh\n", os.Getuid(), os.Getgid(), home)...)
	passwd = append(passwd, extraPasswd...)
	if len(group) > 0 && group[len(group)-1] != '\n' {
		group = append(group, '\n')
	}
	group = append(group, extraGroup...)
	db := &users.DB{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
	if err := os.WriteFile(db.PasswdPath, passwd, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db.GroupPath, group, 0o644); err != nil {
		t.Fatal(err)
	}
	return db
}

// Client is an HTTP client that speaks HTTP/1.1, as E2B's JS SDK does.
var Client = &http.Client{}
