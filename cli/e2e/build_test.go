package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/smallroot"
)

// marker is a file only the test image has.
const marker = "from the test registry"

// pushSmallImage pushes the small image (package smallroot) with the
// marker file to the test registry as repo:tag and returns its reference.
func pushSmallImage(t *testing.T, repoTag string) string {
	return smallroot.Push(t, registryHost, repoTag, map[string]string{"etc/cli-e2e-marker": marker + "\n"})
}

type builtTemplate struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Status     string   `json:"status"`
}

// startedSandbox starts a detached sandbox from template and returns its id.
func startedSandbox(t *testing.T, c *cli, template string) string {
	t.Helper()
	var s struct {
		SandboxID  string `json:"sandboxID"`
		TemplateID string `json:"templateID"`
	}
	c.okJSON(&s, "start", template, "-d", "--timeout", "5m")
	if s.SandboxID == "" {
		t.Fatalf("start %s: no sandbox id", template)
	}
	t.Cleanup(func() { c.run("rm", s.SandboxID) })
	return s.SandboxID
}

// TestPull: `aenv pull` builds a template on aenvd from an image in a
// registry (following the log), a sandbox from it runs the image's files;
// a missing image fails with the registry's reason and exit code 1.
func TestPull(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	c.timeout = 20 * time.Minute
	ref := pushSmallImage(t, "cli/small:v1")

	r := c.fails([]string{"build", "of template cli-missing failed", "NAME_UNKNOWN"}, "pull", registryHost+"/cli/nosuch:v1", "--name", "cli-missing", "--poll", "200ms")
	if !strings.Contains(r.stderr, "Building template cli-missing") {
		t.Fatalf("pull of a missing image: %s", r)
	}
	c.ok("template", "rm", "cli-missing")

	var tpl builtTemplate
	r = c.ok("pull", ref, "--poll", "200ms", "-o", "json") // the name defaults to the repository's: small
	if err := jsonDecode(r.stdout, &tpl); err != nil || tpl.Status != "ready" || tpl.TemplateID == "" {
		t.Fatalf("pull -o json: %v\n%s", err, r)
	}
	if !strings.Contains(r.stderr, "Building template small") || !strings.Contains(r.stderr, ref) {
		t.Fatalf("pull log not followed: %s", r)
	}
	id := startedSandbox(t, c, "small")
	if r := c.ok("exec", id, "--", "cat", "/etc/cli-e2e-marker"); r.stdout != marker+"\n" {
		t.Fatalf("exec in the pulled template: %s", r)
	}
	// watch a finished build: its whole log, then the result.
	r = c.ok("template", "watch", tpl.TemplateID, tpl.BuildID)
	rows := tableRows(t, r.stdout, "TEMPLATE ID", "BUILD ID", "STATUS")
	if len(rows) != 1 || rows[0][0] != tpl.TemplateID || rows[0][2] != "ready" || !strings.Contains(r.stderr, ref) {
		t.Fatalf("template watch: %s", r)
	}
	c.ok("rm", id)
	if r := c.ok("template", "rm", tpl.TemplateID); r.stdout != "Removed template "+tpl.TemplateID+"\n" {
		t.Fatalf("template rm: %s", r)
	}
	c.fails([]string{"small"}, "start", "small", "-d")
}

// TestBuildDockerfile: `aenv build` of a Dockerfile with ARG, ENV, WORKDIR,
// USER, COPY and RUN; a sandbox from the template shows the copied files,
// the environment, the working directory and the user.
func TestBuildDockerfile(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	c.timeout = 20 * time.Minute
	ref := pushSmallImage(t, "cli/base:v1")
	dir := t.TempDir()
	files := map[string]string{
		"Dockerfile": "FROM " + ref + "\n" +
			"ARG GREETING=hi\n" +
			"LABEL purpose=e2e\n" +
			"ENV APP_MSG=\"${GREETING} world\" APP_MODE=test\n" +
			"WORKDIR /app\n" +
			"COPY --chown=user src/ ./src/\n" +
			"COPY conf.txt /etc/app.conf\n" +
			"RUN echo \"$GREETING from $(id -un) in $(pwd)\" > built.txt\n" +
			"USER user\n" +
			"WORKDIR work\n" +
			"RUN id -un > who.txt\n",
		"src/a.txt": "alpha\n", "src/sub/run.sh": "#!/bin/sh\necho run ok\n", "conf.txt": "conf\n",
		"secret.key": "never uploaded\n", ".dockerignore": "*.key\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "src/sub/run.sh"), 0o755)

	var tpl builtTemplate
	r := c.ok("build", dir, "--name", "cli-built", "--build-arg", "GREETING=hello", "--poll", "200ms", "-o", "json")
	if err := jsonDecode(r.stdout, &tpl); err != nil || tpl.Status != "ready" || !slices.Contains(tpl.Names, "cli-built") {
		t.Fatalf("build -o json: %v\n%s", err, r)
	}
	for _, want := range []string{"warning: ", "LABEL ignored", "Uploaded COPY src", "Uploaded COPY conf.txt"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("build stderr lacks %q: %s", want, r)
		}
	}
	id := startedSandbox(t, c, "cli-built")
	script := `cat /app/built.txt; echo "$APP_MSG $APP_MODE [$GREETING]"; pwd; id -un; cat /app/work/who.txt; ` +
		`stat -c '%U %a' /app/src/a.txt /app/src/sub/run.sh; cat /etc/app.conf; /app/src/sub/run.sh; ls /app/src`
	r = c.ok("exec", id, "--", "/bin/bash", "-l", "-c", script)
	want := "hello from root in /app\nhello world test []\n/app/work\nuser\nuser\nuser 644\nuser 755\nconf\nrun ok\na.txt\nsub\n"
	if r.stdout != want {
		t.Fatalf("the built template:\n got %q\nwant %q\n%s", r.stdout, want, r)
	}

	// Listed (json and table) while it exists; removed once unused.
	var ts []struct {
		TemplateID  string   `json:"templateID"`
		Aliases     []string `json:"aliases"`
		BuildStatus string   `json:"buildStatus"`
	}
	c.okJSON(&ts, "template", "list")
	if !slices.ContainsFunc(ts, func(x struct {
		TemplateID  string   `json:"templateID"`
		Aliases     []string `json:"aliases"`
		BuildStatus string   `json:"buildStatus"`
	}) bool {
		return x.TemplateID == tpl.TemplateID && slices.Contains(x.Aliases, "cli-built") && x.BuildStatus == "ready"
	}) {
		t.Fatalf("template list lacks cli-built: %+v", ts)
	}
	rows := tableRows(t, c.ok("template", "list").stdout, "TEMPLATE ID", "ALIASES", "STATUS")
	if !slices.ContainsFunc(rows, func(r []string) bool { return r[0] == tpl.TemplateID && r[1] == "cli-built" && r[2] == "ready" }) {
		t.Fatalf("template table lacks cli-built: %v", rows)
	}
	c.fails([]string{"remove template " + tpl.TemplateID, "409"}, "template", "rm", tpl.TemplateID)
	c.ok("rm", id)
	c.ok("template", "rm", tpl.TemplateID)
	if r := c.ok("template", "list"); strings.Contains(r.stdout, "cli-built") {
		t.Fatalf("removed template still listed: %s", r)
	}
}

// TestBuildDockerfileFails: a RUN step that fails ends `aenv build` with
// exit code 1 and the step's reason; a bad Dockerfile fails before the
// server is asked for anything.
func TestBuildDockerfileFails(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	c.timeout = 20 * time.Minute
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+registryHost+"/cli/none:v1\nSHELL [\"/bin/bash\", \"-c\"]\n"), 0o644)
	c.fails([]string{"Dockerfile line 2: SHELL: not supported"}, "build", dir, "--name", "cli-bad")
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+registryHost+"/cli/none:v1\nCOPY ../x /x\n"), 0o644)
	c.fails([]string{"outside the build context"}, "build", dir, "--name", "cli-bad")
	var ts []struct {
		Aliases []string `json:"aliases"`
	}
	c.okJSON(&ts, "template", "list")
	for _, x := range ts {
		if slices.Contains(x.Aliases, "cli-bad") {
			t.Fatalf("a template was created from a bad Dockerfile: %+v", ts)
		}
	}
	// Server-side failures: the base image does not exist; a RUN step fails
	// (its output is in the log, its exit code in the reason).
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+registryHost+"/cli/none:v1\nRUN true\n"), 0o644)
	c.fails([]string{"build", "of template cli-bad failed", "NAME_UNKNOWN"}, "build", dir, "--name", "cli-bad", "--poll", "200ms")
	c.ok("template", "rm", "cli-bad")
	ref := pushSmallImage(t, "cli/base:v1")
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+ref+"\nRUN echo about to fail; exit 3\nRUN echo never\n"), 0o644)
	r := c.fails([]string{"of template cli-bad failed", "code 3"}, "build", dir, "--name", "cli-bad", "--poll", "200ms")
	if !strings.Contains(r.stderr, "about to fail\n") || strings.Contains(r.stderr, "echo never") {
		t.Fatalf("failing RUN step: %s", r)
	}
	c.ok("template", "rm", "cli-bad")
}

func jsonDecode(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// TestBuildFromNodeTemplate: `aenv build` of a Dockerfile whose FROM names
// the node's base template builds on it with nothing pulled (no registry
// involved); a sandbox of it has the base's files and the new ones.
func TestBuildFromNodeTemplate(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	c.timeout = 10 * time.Minute
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM base\nCOPY note.txt /home/user/note.txt\nRUN echo built on base > /home/user/built.txt\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "note.txt"), []byte("copied\n"), 0o644)
	var tpl builtTemplate
	r := c.ok("build", dir, "--name", "cli-from-base", "--poll", "200ms", "-o", "json")
	if err := jsonDecode(r.stdout, &tpl); err != nil || tpl.Status != "ready" {
		t.Fatalf("build FROM base: %v\n%s", err, r)
	}
	id := startedSandbox(t, c, "cli-from-base")
	r = c.ok("exec", id, "--", "/bin/bash", "-c", "cat /home/user/note.txt /home/user/built.txt; command -v python3 >/dev/null && echo base tools")
	if want := "copied\nbuilt on base\nbase tools\n"; r.stdout != want {
		t.Fatalf("the template built FROM base:\n got %q\nwant %q\n%s", r.stdout, want, r)
	}
	c.ok("rm", id)
	c.ok("template", "rm", tpl.TemplateID)
}
