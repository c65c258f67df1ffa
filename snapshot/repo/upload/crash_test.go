package upload

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
)

// crashChild is the environment variable that makes TestCrashResumes the
// process that crashes: it holds the repository directory, the queue
// directory and the job.
const crashChild = "AENV_UPLOAD_CRASH_CHILD"

type childArgs struct {
	Repo, Queue string
	Job         Job
}

// runChild enqueues the job and uploads until the armed fault point kills
// the process.
func runChild(t *testing.T, spec string) {
	var a childArgs
	if err := json.Unmarshal([]byte(spec), &a); err != nil {
		t.Fatal(err)
	}
	r, err := posix.Open(a.Repo, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := New(r, Options{Dir: a.Queue})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Enqueue(context.Background(), a.Job); err != nil {
		t.Fatal(err)
	}
	u.Start(context.Background())
	_, err = u.Wait(context.Background(), a.Job.Name)
	t.Fatalf("the child was not killed by its fault point (wait: %v)", err)
}

// TestCrashResumes kills a process (SIGKILL, from a fault point) in the
// middle of an upload, before and after the commit's lease, and checks that
// the next process on the same queue finishes the job, and that GC drops a
// lease the dead commit left once it is stale.
func TestCrashResumes(t *testing.T) {
	if spec := os.Getenv(crashChild); spec != "" {
		runChild(t, spec)
		return
	}
	for point, leases := range map[string]int{"upload/blobs-uploaded": 0, "repo/commit/verified": 1} {
		t.Run(filepath.Base(point), func(t *testing.T) {
			a := childArgs{Repo: t.TempDir(), Queue: t.TempDir(), Job: localSnapshot(t, "snap-crash", 300)}
			spec, _ := json.Marshal(a)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashResumes$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashChild+"="+string(spec), failpoint.EnvVar+"="+point+"=crash")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child did not die at %s: %v\n%s", point, err, out)
			}
			r, err := posix.Open(a.Repo, repo.Options{LeaseTTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Manifest(context.Background(), a.Job.Name); !errors.Is(err, repo.ErrNotFound) {
				t.Fatalf("a manifest is visible after a crash before its write: %v", err)
			}
			if left, _ := r.Backend().List(context.Background(), "leases/"); len(left) != leases {
				t.Fatalf("%d leases after a crash at %s, want %d", len(left), point, leases)
			}
			u, err := New(r, Options{Dir: a.Queue})
			if err != nil {
				t.Fatal(err)
			}
			if st, ok := u.Status(a.Job.Name); !ok || st.State != Pending || st.Attempts != 1 {
				t.Fatalf("after the crash the job is %+v (%v), want pending after one attempt", st, ok)
			}
			u.Start(context.Background())
			defer u.Close()
			if st, err := u.Wait(context.Background(), a.Job.Name); err != nil || st.State != Uploaded {
				t.Fatalf("the restarted uploader: %+v, %v", st, err)
			}
			checkCommitted(t, r, a.Job)
			time.Sleep(1100 * time.Millisecond) // the dead commit's lease goes stale
			if _, err := r.GC(context.Background(), repo.GCOptions{}); err != nil {
				t.Fatal(err)
			}
			if leases, _ := r.Backend().List(context.Background(), "leases/"); len(leases) != 0 {
				t.Fatalf("GC left the dead commit's lease: %v", leases)
			}
		})
	}
}
