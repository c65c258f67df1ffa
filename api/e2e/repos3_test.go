package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
)

// TestTwoNodesOverS3: two nodes (their own data dirs, network prefixes and
// ports) share one bucket of a real S3 server (versitygw). A sandbox of a
// template built on A, paused on A, resumes on B, which never saw either,
// with its files, a file in tmpfs and a running process intact (read
// through E2B's SDK); B brings the template with it, and it then serves
// creates on B by its name.
func TestTwoNodesOverS3(t *testing.T) {
	nodePrereqs(t)
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	env := s3test.NodeEnv(bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	r, err := s3.Open(ctx, bucket, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := repoPeer(ctx, t, "ads3a", 99, env...)
	b := repoPeer(ctx, t, "ads3b", 101, env...)

	const name = "over-s3"
	tid, bid := a.buildFromBase(t, name, "echo built-on-a > /home/user/built.txt")
	t.Cleanup(func() { a.call(t, "DELETE", "/templates/"+tid, a.key, "") })
	for st := a.buildState(tid, bid); st != "ready"; st = a.buildState(tid, bid) {
		if st == "error" || ctx.Err() != nil {
			t.Fatalf("build %s on node A: %q", bid, st)
		}
		time.Sleep(time.Second)
	}
	// A sandbox of the template, paused on A, resumes on B, which brings
	// the template along with it.
	id := a.create(t, `{"templateID":"`+name+`","timeout":300}`)
	data := a.writeData(t, id, "over-s3")
	a.sh(t, id, `echo in-tmpfs > /dev/shm/marker; nohup sleep 100000 >/dev/null 2>&1 & echo $! > /home/user/sleeper.pid; sync`)
	a.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", a.key, "")
	waitManifest(ctx, t, r, "template-"+tid+"-")
	waitManifest(ctx, t, r, "sandbox-"+id+"-")
	b.expect(t, http.StatusNotFound, "GET", "/templates/"+tid, b.key, "")
	b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":120}`)
	b.sdkCheck(t, id, data)
	if got := b.sh(t, id, `cat /dev/shm/marker /home/user/built.txt; kill -0 $(cat /home/user/sleeper.pid) && echo alive`); got != "in-tmpfs\nbuilt-on-a\nalive" {
		t.Fatalf("on node B: tmpfs, the template's file and the process read %q", got)
	}
	// And the template, now on B, serves creates there by its name.
	child := b.create(t, `{"templateID":"`+name+`","timeout":120}`)
	if got := b.sh(t, child, "cat /home/user/built.txt"); got != "built-on-a" {
		t.Fatalf("a sandbox of %s on node B reads %q", name, got)
	}
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+child, b.key, "")
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
	b.expect(t, http.StatusNoContent, "DELETE", "/templates/"+name, b.key, "")
	a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")
}
