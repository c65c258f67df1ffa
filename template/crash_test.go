package template_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/vmmproc"
	_ "github.com/agentenv/agentenv/orchestrator" // declares orchestrator/template/... fault points
	_ "github.com/agentenv/agentenv/template"
)

// crashCommits kills aenvd (SIGKILL from the fault point) at each step of a
// template's commit, restarts it, and checks the outcome: a crash before
// the record says "ready" fails the build with its reason and leaves no
// VMM behind, and a build of the same template afterwards succeeds; a crash
// after it (the memory import) leaves a template that serves sandboxes with
// what the build wrote.
func crashCommits(t *testing.T, c buildClient) {
	points := append(failpoint.Names("template/commit/"), failpoint.Names("orchestrator/template/")...)
	if len(points) < 3 {
		t.Fatalf("commit fault points: %v", points)
	}
	for i, point := range points {
		t.Run(point, func(t *testing.T) {
			c := buildClient{t: t, n: c.n}
			name := fmt.Sprintf("crash-%d", i)
			spec := fmt.Sprintf(`{"fromTemplate":"busy-box","steps":[{"type":"USER","args":["root"]},{"type":"RUN","args":["echo %s > /commit.txt"]}]}`, name)
			if err := c.n.Arm(point, "crash"); err != nil {
				t.Fatal(err)
			}
			tid, bid := c.start(name, spec, nil)
			c.waitCrash(point, tid, bid)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := c.n.Restart(ctx, 4*time.Minute); err != nil {
				t.Fatal(err)
			}
			if left := vmmsUnder(tid); len(left) > 0 {
				t.Fatalf("VMM processes of the build survive the restart: %v", left)
			}
			st, logs := c.wait(tid, bid, name)
			if strings.HasPrefix(point, "template/") {
				if st.Status != "error" || st.Reason == nil || st.Reason.Message != "interrupted by node restart" {
					t.Fatalf("build crashed at %s: %s %+v\n%s", point, st.Status, st.Reason, logs)
				}
				_, bid = c.rebuild(name, spec)
				if st, logs = c.wait(tid, bid, name); st.Status != "ready" {
					t.Fatalf("rebuild after a crash at %s: %s %+v\n%s", point, st.Status, st.Reason, logs)
				}
			} else if st.Status != "ready" {
				t.Fatalf("build crashed at %s (after its commit): %s %+v\n%s", point, st.Status, st.Reason, logs)
			}
			if got := c.runIn(name, "cat /commit.txt"); got != name {
				t.Fatalf("a sandbox of %s reads %q, want %q", name, got, name)
			}
			c.call("DELETE", "/templates/"+name, "", http.StatusNoContent)
		})
	}
}

// waitCrash waits for aenvd to die of SIGKILL at point during the build,
// failing at once when the build ends without reaching it.
func (c buildClient) waitCrash(point, tid, bid string) {
	c.t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		if st, err := c.n.WaitExit(2 * time.Second); err == nil {
			if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				c.t.Fatalf("aenvd ended with %v, want SIGKILL at %s\n%s", st, point, c.n.Logs())
			}
			return
		}
		code, b, _, err := c.n.Call("GET", "/templates/"+tid+"/builds/"+bid+"/status?level=error", c.n.Key, "")
		var st buildStatus
		if err == nil && code == http.StatusOK && json.Unmarshal(b, &st) == nil && (st.Status == "ready" || st.Status == "error") {
			c.t.Fatalf("the build ended %s without reaching %s: %s", st.Status, point, b)
		}
	}
	c.t.Fatalf("aenvd did not crash at %s within 5 minutes\n%s", point, c.n.Logs())
}

// rebuild starts another build of the template name names.
func (c buildClient) rebuild(name, spec string) (string, string) {
	c.t.Helper()
	var created struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	body := fmt.Sprintf(`{"name":%q,"cpuCount":1,"memoryMB":256}`, name)
	if err := json.Unmarshal(c.call("POST", "/v3/templates", body, http.StatusAccepted), &created); err != nil {
		c.t.Fatal(err)
	}
	c.call("POST", "/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, spec, http.StatusAccepted)
	return created.TemplateID, created.BuildID
}

// runIn starts a sandbox from template, runs cmd in it as root and kills it.
func (c buildClient) runIn(template, cmd string) string {
	c.t.Helper()
	id, err := c.n.Create(fmt.Sprintf(`{"templateID":%q,"timeout":120}`, template))
	if err != nil {
		c.t.Fatal(err)
	}
	defer c.call("DELETE", "/sandboxes/"+id, "", http.StatusNoContent)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := aenvdtest.AgentClient(id)
	out, errOut, code, err := agentclient.RunWith(ctx, c.n.Proxy, hc, []agentclient.Option{agentclient.WithUser("root")}, "/bin/sh", "-c", cmd)
	if err != nil || code != 0 {
		c.t.Fatalf("%s: exit %d, %v\n%s%s", cmd, code, err, out, errOut)
	}
	return strings.TrimSpace(string(out))
}

// vmmsUnder lists QEMU processes whose command line or open files mention
// a template's directory.
func vmmsUnder(templateID string) []string {
	var out []string
	for _, pid := range vmmproc.Mentioning("/templates/" + templateID + "/") {
		out = append(out, strconv.Itoa(pid))
	}
	return out
}
