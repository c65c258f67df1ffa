package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// repoRoot is the checkout this package lives in.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("locate the test source")
	}
	return filepath.Dir(filepath.Dir(file))
}

// run runs a command and returns its combined output; it fails the test
// when the command fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(t, dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(t *testing.T, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

// reporter is what the policy checks need of a *testing.T, so the
// rejection tests can run them on a collector instead.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// collector records the errors of a check run on deliberately broken input.
type collector struct{ errs []string }

func (c *collector) Helper() {}
func (c *collector) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (install.sh chowns files and creates users in the target root)")
	}
}

func requireTool(t *testing.T, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Missing(t, "%s not installed (%s)", name, why)
	}
	return p
}

// unit is a parsed systemd unit file: section -> key -> values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: bad line %q", path, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// get is the last value of a key (what systemd applies for single-valued keys).
func (u unit) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// words is every value of a list-valued key, split on spaces.
func (u unit) words(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// nspawnPrereqs ends a test that runs a Debian tree under systemd-nspawn
// where it cannot run (-short: what says what it does; not root; no
// nspawn or debootstrap) and returns the checkout and its built bin/.
func nspawnPrereqs(t *testing.T, what string) (repo, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + what)
	}
	requireRoot(t)
	testenv.RequireTool(t, "systemd-nspawn", "Debian systemd-container; .ci/setup.d/50-deploy.sh")
	testenv.RequireTool(t, "debootstrap", "Debian debootstrap; scripts/setup.sh")
	repo = repoRoot(t)
	bin = filepath.Join(repo, "bin")
	if _, err := os.Stat(filepath.Join(bin, "aenvd")); err != nil {
		t.Fatalf("no aenvd in %s (make build): %v", bin, err)
	}
	return repo, bin
}
