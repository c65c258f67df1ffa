package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestErrorsWithoutServer: no key, an unreachable server and bad flags
// fail with exit 1 and say what to do.
func TestErrorsWithoutServer(t *testing.T) {
	c := newCLI(t)
	c.fails([]string{"no API key", "aenv auth"}, "list")
	c = newCLI(t, "AENV_URL=http://127.0.0.1:1", "AENV_API_KEY=k")
	c.fails([]string{"cannot reach aenvd at http://127.0.0.1:1", "is aenvd running"}, "list")
	c.fails([]string{"--output", "table or json"}, "nodes", "-o", "yaml")
	c.fails([]string{"--state", "running or paused"}, "list", "--state", "stopped")
	c.fails([]string{"KEY=VALUE"}, "start", "base", "-d", "--metadata", "novalue")
	c.fails([]string{"--count", "1 to 100"}, "fork", "x", "--count", "0")
	c.fails([]string{"timeout", "duration"}, "timeout", "x", "soon")
	c.fails([]string{"URL", "not an http(s) URL"}, "auth", "--url", "ftp://x", "--api-key", "k", "--no-verify")

	// version and completion need no server.
	if r := c.ok("version"); !strings.HasPrefix(r.stdout, "aenv ") {
		t.Fatalf("version: %s", r)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if r := c.ok("completion", sh); !strings.Contains(r.stdout, "aenv") || len(r.stdout) < 500 {
			t.Fatalf("completion %s: %s", sh, r)
		}
	}
}

// TestAuth stores the URL and key (mode 0600) after checking them, refuses a
// bad key, and the environment overrides the stored values.
func TestAuth(t *testing.T) {
	n := node(t)
	c := newCLI(t)
	c.fails([]string{"verify the credentials", "401", "check the API key"}, "auth", "--url", n.API, "--api-key", "wrong")
	r := c.runIn(n.Key+"\n", "auth", "--url", n.API) // key from stdin
	if r.code != 0 {
		t.Fatalf("auth: %s", r)
	}
	p := filepath.Join(c.home, ".config", "aenv", "config.json")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatalf("config not written: %v\n%s", err, r)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("config mode %v, want 0600", st.Mode().Perm())
	}
	var cfg struct{ URL, APIKey string }
	b, _ := os.ReadFile(p)
	if json.Unmarshal(b, &cfg) != nil || cfg.URL != n.API || cfg.APIKey != n.Key {
		t.Fatalf("config %s", b)
	}
	if !strings.Contains(r.stdout, "Saved "+p) {
		t.Fatalf("auth output: %s", r)
	}
	// The stored config works; AENV_API_KEY overrides it.
	var nodes []struct {
		NodeID string `json:"nodeID"`
		Status string `json:"status"`
	}
	c.okJSON(&nodes, "nodes")
	if len(nodes) != 1 || nodes[0].NodeID == "" {
		t.Fatalf("nodes: %+v", nodes)
	}
	rows := tableRows(t, c.ok("nodes").stdout, "NODE ID", "STATUS", "RUNNING/PAUSED")
	if len(rows) != 1 || rows[0][0] != nodes[0].NodeID || rows[0][1] != nodes[0].Status {
		t.Fatalf("nodes table %v vs json %+v", rows, nodes)
	}
	c.env = []string{"AENV_API_KEY=wrong"}
	c.fails([]string{"list sandboxes", "401", "aenv auth"}, "list")
}

type listed struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	State      string            `json:"state"`
	EndAt      time.Time         `json:"endAt"`
	Metadata   map[string]string `json:"metadata"`
}

func (c *cli) list(args ...string) []listed {
	c.t.Helper()
	var l []listed
	c.okJSON(&l, append([]string{"list"}, args...)...)
	return l
}

func find(l []listed, id string) *listed {
	for i := range l {
		if l[i].SandboxID == id {
			return &l[i]
		}
	}
	return nil
}

// TestSandboxCommands walks one sandbox through every command.
func TestSandboxCommands(t *testing.T) {
	n := node(t)
	c := forNode(t, n)

	var sbx struct {
		SandboxID  string `json:"sandboxID"`
		TemplateID string `json:"templateID"`
	}
	c.okJSON(&sbx, "start", "base", "-d", "--timeout", "5m", "--env", "GREETING=hi there", "--metadata", "owner=clitest", "--metadata", "run=1")
	id := sbx.SandboxID
	if id == "" || sbx.TemplateID != "base" {
		t.Fatalf("start -d -o json: %+v", sbx)
	}
	t.Cleanup(func() { c.run("rm", id) })

	// list: json, table, filters.
	got := find(c.list(), id)
	if got == nil || got.State != "running" || got.Metadata["owner"] != "clitest" || got.Metadata["run"] != "1" {
		t.Fatalf("list -o json: %+v", got)
	}
	if time.Until(got.EndAt) < 4*time.Minute {
		t.Fatalf("endAt %v: --timeout 5m not applied", got.EndAt)
	}
	rows := tableRows(t, c.ok("list").stdout, "SANDBOX ID", "TEMPLATE", "STATE", "METADATA")
	if !slices.ContainsFunc(rows, func(r []string) bool {
		return r[0] == id && r[1] == "base" && r[2] == "running" && r[len(r)-1] == "owner=clitest,run=1"
	}) {
		t.Fatalf("list table lacks %s:\n%v", id, rows)
	}
	if find(c.list("--metadata", "owner=clitest", "--state", "running"), id) == nil {
		t.Fatal("list --metadata owner=clitest --state running misses the sandbox")
	}
	if find(c.list("--metadata", "owner=someone-else"), id) != nil || find(c.list("--state", "paused"), id) != nil {
		t.Fatal("list filters let the sandbox through")
	}

	// exec: output streams, exit code, env from start and from --env, stdin.
	r := c.run("exec", id, "--", "sh", "-c", `echo "$GREETING/$EXTRA"; echo oops >&2; exit 7`)
	if r.code != 7 || r.stdout != "hi there/\n" || r.stderr != "oops\n" {
		t.Fatalf("exec exit 7: %s", r)
	}
	r = c.ok("exec", "-e", "EXTRA=x y", id, "--", "sh", "-c", `echo "$GREETING/$EXTRA"`)
	if r.stdout != "hi there/x y\n" {
		t.Fatalf("exec --env: %s", r)
	}
	if r = c.ok("exec", id, "--", "echo", "a  b", "$HOME"); r.stdout != "a  b $HOME\n" {
		t.Fatalf("exec keeps arguments as given: %s", r)
	}
	if r = c.runIn("line1\nline2\n", "exec", "-i", id, "--", "wc", "-l"); r.code != 0 || strings.TrimSpace(r.stdout) != "2" {
		t.Fatalf("exec -i: %s", r)
	}
	if r = c.run("exec", id, "--", "/no/such/cmd"); r.code != 127 || !strings.Contains(r.stderr, "/no/such/cmd") {
		t.Fatalf("exec of a missing command: want exit 127 and its name, got %s", r)
	}

	// Ctrl-C on exec stops the remote command too.
	interrupted(t, c, id)

	// upload and download a file larger than one chunk.
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	local := filepath.Join(t.TempDir(), "blob.bin")
	if err := os.WriteFile(local, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if r = c.ok("upload", id, local, "/tmp/blob.bin"); r.stdout != "" || r.stderr != "" {
		t.Fatalf("upload to a pipe prints nothing (no progress bar): %s", r)
	}
	sum := sha256.Sum256(data)
	r = c.ok("exec", id, "--", "sha256sum", "/tmp/blob.bin")
	if !strings.HasPrefix(r.stdout, hex.EncodeToString(sum[:])) {
		t.Fatalf("uploaded file hash %q, want %x", r.stdout, sum)
	}
	back := filepath.Join(t.TempDir(), "back.bin")
	if r = c.ok("download", id, "/tmp/blob.bin", back); r.stdout != "" || r.stderr != "" {
		t.Fatalf("download to a file with stderr a pipe prints nothing: %s", r)
	}
	if b, err := os.ReadFile(back); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("downloaded file differs (%d bytes, %v)", len(b), err)
	}
	if r = c.runIn("from stdin\n", "upload", id, "-", "note.txt"); r.code != 0 {
		t.Fatalf("upload from stdin: %s", r)
	}
	if r = c.ok("download", id, "note.txt", "-"); r.stdout != "from stdin\n" {
		t.Fatalf("download to stdout: %s", r)
	}
	c.fails([]string{"download /no/such/file", "404"}, "download", id, "/no/such/file", filepath.Join(t.TempDir(), "x"))

	// timeout
	if r = c.ok("timeout", id, "10m"); !strings.Contains(r.stdout, "10m0s") {
		t.Fatalf("timeout: %s", r)
	}
	if got = find(c.list(), id); got == nil || time.Until(got.EndAt) < 9*time.Minute {
		t.Fatalf("timeout 10m not applied: %+v", got)
	}

	// pause: exec refuses with a hint; resume brings back the memory state.
	c.ok("exec", id, "--", "sh", "-c", "echo kept > /dev/shm/mark")
	if r = c.ok("pause", id); r.stdout != "Paused "+id+"\n" {
		t.Fatalf("pause: %s", r)
	}
	if got = find(c.list("--state", "paused"), id); got == nil || got.State != "paused" {
		t.Fatalf("list --state paused after pause: %+v", got)
	}
	c.fails([]string{"is paused", "aenv resume " + id}, "exec", id, "--", "true")
	c.fails([]string{"pause sandbox " + id, "409"}, "pause", id)
	var resumed struct {
		SandboxID string `json:"sandboxID"`
	}
	c.okJSON(&resumed, "resume", id)
	if resumed.SandboxID != id {
		t.Fatalf("resume -o json: %+v", resumed)
	}
	r = c.run("exec", id, "--", "cat", "/dev/shm/mark")
	if r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("memory after resume: %s", r)
	}
	rows = tableRows(t, c.ok("resume", id).stdout, "SANDBOX ID", "TEMPLATE")
	if len(rows) != 1 || rows[0][0] != id {
		t.Fatalf("resume of a running sandbox: %v", rows)
	}

	// pause --no-memory keeps the disk only: the resume is a new boot.
	bootID := strings.TrimSpace(c.ok("exec", id, "--", "cat", "/proc/sys/kernel/random/boot_id").stdout)
	c.ok("exec", id, "--", "sh", "-c", "echo disk > /home/user/on-disk && sync")
	if r = c.ok("pause", "--no-memory", id); r.stdout != "Paused "+id+"\n" {
		t.Fatalf("pause --no-memory: %s", r)
	}
	c.ok("resume", id)
	if r = c.ok("exec", id, "--", "cat", "/proc/sys/kernel/random/boot_id"); strings.TrimSpace(r.stdout) == bootID {
		t.Fatalf("resume after pause --no-memory kept the boot %s: memory was restored", bootID)
	}
	if r = c.run("exec", id, "--", "cat", "/dev/shm/mark"); r.code == 0 {
		t.Fatalf("memory-only state survived pause --no-memory: %s", r)
	}
	if r = c.ok("exec", id, "--", "cat", "/home/user/on-disk"); r.stdout != "disk\n" {
		t.Fatalf("the disk after pause --no-memory: %s", r)
	}

	// fork and snapshots: exercised if the server has them, else a clear error.
	if r = c.run("fork", id, "--count", "1", "-o", "json"); r.code == 0 {
		var kids []struct {
			Sandbox *struct {
				SandboxID string `json:"sandboxID"`
			} `json:"sandbox"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &kids); err != nil || len(kids) != 1 || kids[0].Sandbox == nil {
			t.Fatalf("fork -o json: %v %s", err, r)
		}
		c.ok("rm", kids[0].Sandbox.SandboxID)
	} else if r.code != 1 || !strings.Contains(r.stderr, "not supported by this server") {
		t.Fatalf("fork on a server without fork: %s", r)
	}
	if r = c.run("snapshot", "list", "-o", "json"); r.code == 0 {
		var snaps []any
		if err := json.Unmarshal([]byte(r.stdout), &snaps); err != nil {
			t.Fatalf("snapshot list -o json: %v %s", err, r)
		}
	} else {
		if r.code != 1 || !strings.Contains(r.stderr, "not supported by this server") {
			t.Fatalf("snapshot list on a server without snapshots: %s", r)
		}
		c.fails([]string{"snapshot sandbox " + id, "not supported by this server"}, "snapshot", "create", id, "--name", "s1")
	}

	// rm, then every command names the unknown sandbox.
	if r = c.ok("rm", id); r.stdout != "Removed "+id+"\n" {
		t.Fatalf("rm: %s", r)
	}
	if find(c.list(), id) != nil {
		t.Fatal("list still shows the removed sandbox")
	}
	for _, args := range [][]string{{"rm", id}, {"exec", id, "--", "true"}, {"pause", id}, {"timeout", id, "60"}, {"resume", id}} {
		c.fails([]string{id, "404", "aenv list"}, args...)
	}
}

// TestTemplates lists the base template (json and table); removing an
// unknown template fails clearly whether or not the server can remove.
func TestTemplates(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	var ts []struct {
		TemplateID  string   `json:"templateID"`
		Aliases     []string `json:"aliases"`
		BuildStatus string   `json:"buildStatus"`
	}
	c.okJSON(&ts, "template", "list")
	i := slices.IndexFunc(ts, func(x struct {
		TemplateID  string   `json:"templateID"`
		Aliases     []string `json:"aliases"`
		BuildStatus string   `json:"buildStatus"`
	}) bool {
		return x.TemplateID == "base" || slices.Contains(x.Aliases, "base")
	})
	if i < 0 {
		t.Fatalf("template list lacks base: %+v", ts)
	}
	rows := tableRows(t, c.ok("template", "list").stdout, "TEMPLATE ID", "ALIASES", "STATUS")
	if !slices.ContainsFunc(rows, func(r []string) bool { return r[0] == ts[i].TemplateID && r[2] == ts[i].BuildStatus }) {
		t.Fatalf("template table lacks %s: %v", ts[i].TemplateID, rows)
	}
	r := c.fails(nil, "template", "rm", "no-such-template")
	if !strings.Contains(r.stderr, "not supported by this server") && !strings.Contains(r.stderr, "404") {
		t.Fatalf("template rm of an unknown template: %s", r)
	}
}

// interrupted runs a long command with exec, interrupts aenv and checks that
// aenv exits 130 and the remote command is gone.
func interrupted(t *testing.T, c *cli, id string) {
	t.Helper()
	cmd := exec.Command(aenvBin, "exec", id, "--", "sh", "-c", "echo started; exec sleep 3071")
	cmd.Env = append([]string{"HOME=" + c.home, "PATH=" + os.Getenv("PATH")}, c.env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "started\n" {
		_ = cmd.Process.Kill()
		t.Fatalf("exec before the interrupt: %q %v; stderr %s", line, err, errb.String())
	}
	count := `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 3071' || true`
	if r := c.ok("exec", id, "--", "sh", "-c", count); strings.TrimSpace(r.stdout) != "1" {
		t.Fatalf("remote sleep not running before the interrupt: %s", r)
	}
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("interrupted exec: exit %d, want 130; stderr %s", code, errb.String())
	}
	if r := c.ok("exec", id, "--", "sh", "-c", count); strings.TrimSpace(r.stdout) != "0" {
		t.Fatalf("remote sleep survived the interrupt: %s", r)
	}
}

// TestStartPiped: `aenv start` without a terminal still attaches (the input
// is typed into the remote shell), returns the shell's exit code, and --rm
// removes the sandbox; `aenv connect ID -- CMD` runs CMD on a pty.
func TestStartPiped(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	r := c.runIn("echo from-$((20+1))\nexit 4\n", "start", "base", "--rm", "--timeout", "2m", "--metadata", "test=piped")
	if r.code != 4 || !strings.Contains(r.stdout, "from-21") {
		t.Fatalf("piped start: want exit 4 and from-21, got %s", r)
	}
	if !strings.Contains(r.stderr, "started from base") {
		t.Fatalf("piped start names the sandbox: %s", r)
	}
	if l := c.list("--metadata", "test=piped"); len(l) != 0 {
		t.Fatalf("start --rm left %+v", l)
	}

	var sbx struct {
		SandboxID string `json:"sandboxID"`
	}
	c.okJSON(&sbx, "start", "base", "-d", "--timeout", "2m")
	t.Cleanup(func() { c.run("rm", sbx.SandboxID) })
	// aenv creates secure sandboxes: the agent refuses requests without
	// the token; aenv sends it.
	req, _ := http.NewRequest("POST", n.Proxy+"/process.Process/List", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", sbx.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("agent of a sandbox aenv started, without a token: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	r = c.run("connect", sbx.SandboxID, "--", "sh", "-c", "tty; exit 5")
	if r.code != 5 || !strings.Contains(r.stdout, "/dev/pts/") {
		t.Fatalf("connect -- sh -c 'tty; exit 5': %s", r)
	}
	if r = c.runIn("secret\n", "upload", sbx.SandboxID, "-", "/tmp/s.txt"); r.code != 0 {
		t.Fatalf("upload to a --secure sandbox: %s", r)
	}
	if r = c.ok("exec", sbx.SandboxID, "--", "cat", "/tmp/s.txt"); r.stdout != "secret\n" {
		t.Fatalf("exec in a --secure sandbox: %s", r)
	}
	if r = c.ok("download", sbx.SandboxID, "/tmp/s.txt", "-"); r.stdout != "secret\n" {
		t.Fatalf("download from a --secure sandbox: %s", r)
	}
	// Piped input without `exit` ends the shell at its end (Ctrl-D).
	if r = c.runIn("echo last-$((3*3))\n", "connect", sbx.SandboxID); r.code != 0 || !strings.Contains(r.stdout, "last-9") {
		t.Fatalf("connect with piped input: %s", r)
	}
	// An attached command keeps its sandbox alive: a 10 s sandbox lives on.
	var short struct {
		SandboxID string `json:"sandboxID"`
	}
	c.okJSON(&short, "start", "base", "-d", "--timeout", "10s")
	t.Cleanup(func() { c.run("rm", short.SandboxID) })
	if got := find(c.list(), short.SandboxID); got == nil || time.Until(got.EndAt) > 11*time.Second {
		t.Fatalf("start --timeout 10s: %+v", got)
	}
	c.ok("exec", short.SandboxID, "--", "sleep", "3")
	if got := find(c.list(), short.SandboxID); got == nil || time.Until(got.EndAt) < 40*time.Second {
		t.Fatalf("exec did not keep the sandbox alive: %+v", got)
	}
	// The table form of start -d.
	rows := tableRows(t, c.ok("start", "base", "-d", "--timeout", "1m").stdout, "SANDBOX ID", "TEMPLATE")
	if len(rows) != 1 || rows[0][1] != "base" {
		t.Fatalf("start -d table: %v", rows)
	}
	c.ok("rm", rows[0][0])
}
