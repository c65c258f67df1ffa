package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
)

// The storage daemon's log lines of a wait for the layer socket
// (storage/blob/unixwait.go).
const (
	layerWaitLine   = "lazy reads wait for the server (aenvd) to come back"
	layerResumeLine = "lazy reads resume"
)

// oldRetryBudget is about how long a lazy read retried a refused layer
// socket before it waited for aenvd (30 attempts 100 ms apart more each):
// the outage below outlasts it, so the test fails on that code.
const oldRetryBudget = 50 * time.Second

// lazyReadsAcrossRestart: a sandbox paused on a resumes lazily on b; a job
// in the guest reads its data set (not read since the resume: its chunks
// were not fetched for the disk) a few seconds later, after aenvd on b was
// killed with SIGKILL. The reads wait in the storage daemon for the layer
// socket, b starts again (a fresh layer socket at the same path), and the
// job's checksums are the data set's with no I/O error in the guest's
// kernel log.
func lazyReadsAcrossRestart(ctx context.Context, t *testing.T, a, b *node, r *repo.Repo) {
	id, data, _ := pausedOn(ctx, t, a, r, "restarted")
	// The background fetch stops before it moves the disk onto files, so
	// the guest's reads below go through the layer socket.
	if err := b.Arm("orchestrator/lazy/fetched", "delay:10m"); err != nil {
		t.Fatal(err)
	}
	b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":600}`)
	job := fmt.Sprintf(`sleep 8; sync; echo 3 > /proc/sys/vm/drop_caches; `+
		`cd /home/user/%s && sha256sum big small-* > /root/lazy-sums 2>&1; echo $? > /root/lazy-done`, data.Tag)
	b.sh(t, id, `rm -f /root/lazy-done; dmesg -C; setsid nohup bash -c '`+job+`' >/dev/null 2>&1 &`)
	storagedLog := filepath.Join(b.DataDir, "storaged", "storaged.log")
	waits0 := strings.Count(readFile(storagedLog), layerWaitLine)
	if err := b.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The job reads about 8 s after it started; the daemon says when its
	// reads wait. (Code that does not say so still gets the same outage.)
	for deadline := killed.Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if strings.Count(readFile(storagedLog), layerWaitLine) > waits0 {
			t.Logf("the storage daemon's reads wait for aenvd %s after the kill", time.Since(killed).Round(time.Second))
			break
		}
	}
	time.Sleep(oldRetryBudget)
	b.start(t)
	t.Logf("aenvd was down %s", time.Since(killed).Round(time.Second))
	for deadline := time.Now().Add(3 * time.Minute); b.sh(t, id, `cat /root/lazy-done 2>/dev/null || true`) == ""; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			kernel, _ := b.try(t, id, `dmesg | tail -20`)
			t.Fatalf("the guest's job did not finish; its kernel log:\n%s\nthe storage daemon's:\n%s\n%s",
				kernel, tail(readFile(storagedLog), 20), b.diagnose(id))
		}
	}
	sums := b.sh(t, id, `cat /root/lazy-sums; cat /root/lazy-done`)
	if want := data.Sums + "\n0"; sums != want {
		t.Fatalf("the guest's job across the aenvd restart read:\n%s\nwant\n%s\n%s", sums, want, b.diagnose(id))
	}
	if errs := b.sh(t, id, `dmesg | grep -ciE 'I/O error|EXT4-fs error' || true`); errs != "0" {
		t.Fatalf("the guest's kernel logged %s I/O errors:\n%s", errs, b.sh(t, id, `dmesg | tail -30`))
	}
	slog := readFile(storagedLog)
	if strings.Count(slog, layerWaitLine) <= waits0 || !strings.Contains(slog, layerResumeLine) {
		t.Fatalf("the storage daemon's log does not say its reads waited for aenvd and resumed:\n%s", tail(slog, 30))
	}
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
	a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
