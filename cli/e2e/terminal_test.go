package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// tmux drives one tmux server of its own (socket -L) for a test.
type tmux struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required for the terminal test (CI installs it): %v", err)
	}
	m := &tmux{t: t, socket: fmt.Sprintf("aenv-e2e-%d", os.Getpid())}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", m.socket, "kill-server").Run() })
	return m
}

func (m *tmux) cmd(args ...string) string {
	m.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", m.socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		m.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// pane returns the visible text (joined wrapped lines) of session s.
func (m *tmux) pane(s string) string { return m.cmd("capture-pane", "-p", "-J", "-t", s) }

// waitFor polls the pane until re matches and returns the match.
func (m *tmux) waitFor(s string, re *regexp.Regexp, within time.Duration) []string {
	m.t.Helper()
	deadline := time.Now().Add(within)
	for {
		text := m.pane(s)
		if got := re.FindStringSubmatch(text); got != nil {
			return got
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("pane %s: no %q within %s:\n%s", s, re, within, text)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (m *tmux) send(s string, keys ...string) {
	m.cmd(append([]string{"send-keys", "-t", s}, keys...)...)
}

// TestTerminal: `aenv start` attaches a shell through tmux: a command's
// output, the initial size and a resize reach the remote pty, Ctrl-C goes to
// the remote process, `exit 3` ends aenv with 3; `aenv connect` re-attaches
// and Ctrl-D ends it with the shell's last status.
func TestTerminal(t *testing.T) {
	n := node(t)
	m := newTmux(t)
	home := t.TempDir()
	env := fmt.Sprintf("env HOME=%s AENV_URL=%s AENV_API_KEY=%s", home, n.API, n.Key)
	run := func(session, args string) {
		// The trailing sleep keeps the pane open so the exit status can be read.
		m.cmd("new-session", "-d", "-s", session, "-x", "100", "-y", "30",
			fmt.Sprintf("%s %s %s; echo AENV-EXIT=$?; sleep 600", env, aenvBin, args))
	}

	run("start", "start base --timeout 5m")
	id := m.waitFor("start", regexp.MustCompile(`Sandbox ([a-z0-9]+) started from base`), 2*time.Minute)[1]
	t.Cleanup(func() { newCLI(t, "AENV_URL="+n.API, "AENV_API_KEY="+n.Key).run("rm", id) })

	m.send("start", "echo hello-$((6*7))", "Enter")
	m.waitFor("start", regexp.MustCompile(`(?m)^hello-42\s*$`), time.Minute)

	size := func() string {
		return strings.TrimSpace(m.cmd("display-message", "-p", "-t", "start", "#{pane_height} #{pane_width}"))
	}
	m.send("start", "clear; stty size", "Enter")
	m.waitFor("start", regexp.MustCompile(`(?m)^`+size()+`\s*$`), 30*time.Second)

	m.cmd("resize-window", "-t", "start", "-x", "123", "-y", "41")
	want := size()
	if !strings.HasSuffix(want, " 123") {
		t.Fatalf("tmux pane size after resize-window: %q", want)
	}
	re := regexp.MustCompile(`(?m)^` + want + `\s*$`)
	for i := 0; ; i++ { // the resize travels asynchronously: ask until it shows
		m.send("start", "clear; stty size", "Enter")
		time.Sleep(time.Second)
		if re.MatchString(m.pane("start")) {
			break
		}
		if i == 20 {
			t.Fatalf("remote pty never saw %s:\n%s", want, m.pane("start"))
		}
	}

	// Ctrl-C interrupts the remote command, not aenv.
	m.send("start", "clear; sleep 300", "Enter")
	time.Sleep(time.Second)
	m.send("start", "C-c")
	m.send("start", "echo after-$((1+1))", "Enter")
	m.waitFor("start", regexp.MustCompile(`(?m)^after-2\s*$`), 30*time.Second)

	m.send("start", "exit 3", "Enter")
	m.waitFor("start", regexp.MustCompile(`(?m)^AENV-EXIT=3\s*$`), 30*time.Second)
	if p := m.pane("start"); !strings.Contains(p, "aenv connect "+id) {
		t.Fatalf("no hint on how to return to the sandbox:\n%s", p)
	}

	// Large transfers on a terminal show a progress bar.
	big := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(big, make([]byte, 24<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	run("upload", "upload "+id+" "+big+" /tmp/big.bin")
	m.waitFor("upload", regexp.MustCompile(`(?m)^AENV-EXIT=0\s*$`), time.Minute)
	if p := m.pane("upload"); !regexp.MustCompile(`upload /tmp/big.bin +100% .*\((\d+)/(\d+) MB`).MatchString(p) || !strings.Contains(p, "(25/25 MB") {
		t.Fatalf("no finished progress bar for a 24 MiB upload:\n%s", p)
	}

	// The sandbox outlived the terminal: connect, Ctrl-D after a failing command.
	run("connect", "connect "+id)
	m.send("connect", "echo back-$((2*5))", "Enter")
	m.waitFor("connect", regexp.MustCompile(`(?m)^back-10\s*$`), time.Minute)
	m.send("connect", "false", "Enter")
	time.Sleep(500 * time.Millisecond)
	m.send("connect", "C-d")
	m.waitFor("connect", regexp.MustCompile(`(?m)^AENV-EXIT=1\s*$`), 30*time.Second)
}
