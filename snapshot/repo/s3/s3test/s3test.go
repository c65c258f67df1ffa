// Package s3test starts a real S3 server for tests and benchmarks: a
// versitygw process with its POSIX backend on a temporary directory,
// listening on a free loopback port. The binary is installed by
// .ci/setup.d/60-versitygw.sh; without it the caller is skipped, saying so.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
)

// Credentials of the server's root account.
const (
	AccessKey = "aenvtestaccess"
	SecretKey = "aenvtestsecret0123456789"
)

// Server is a running versitygw.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	Dir      string // the POSIX backend's root: one directory per bucket
	client   *minio.Client
	buckets  atomic.Int64
	bin      string
	addr     string
	stop     func()
}

// Binary finds the versitygw executable: on PATH, or where go install puts it.
func Binary() (string, bool) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, true
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, _ := os.UserHomeDir()
		gopath = filepath.Join(home, "go")
	}
	p := filepath.Join(strings.Split(gopath, string(os.PathListSeparator))[0], "bin", "versitygw")
	if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
		return p, true
	}
	return "", false
}

// Start starts a server that lives until the end of tb.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, ok := Binary()
	if !ok {
		testenv.Missing(tb, "versitygw is not installed (run .ci/setup.d/60-versitygw.sh): the S3 tests need a real S3 server")
	}
	var last error
	for range 3 { // the free port may be taken between the probe and the server's bind
		addr, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s := &Server{Endpoint: "http://" + addr, Dir: tb.TempDir(), bin: bin, addr: addr}
		if last = s.run(); last == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("start versitygw: %v", last)
	return nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// run starts the process and waits until it answers.
func (s *Server) run() error {
	var logs bytes.Buffer
	cmd := exec.Command(s.bin, "--access", AccessKey, "--secret", SecretKey, "--port", s.addr, "--quiet", "posix", s.Dir)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	c, err := minio.New(s.addr, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		s.Stop()
		return err
	}
	s.client = c
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = c.ListBuckets(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			exited <- werr
			s.Stop()
			return fmt.Errorf("versitygw exited (%v): %s", werr, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("versitygw did not answer on %s: %v: %s", s.addr, err, logs.String())
		}
	}
}

// Stop kills the server (the store is down until Restart).
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// Restart starts the server again on the same address and directory.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.run(); err != nil {
		tb.Fatalf("restart versitygw: %v", err)
	}
}

// Bucket creates a fresh bucket and returns the repository configuration
// that reaches it (path-style, with the server's credentials).
func (s *Server) Bucket(tb testing.TB) s3.Config {
	tb.Helper()
	name := fmt.Sprintf("b%d-%d", time.Now().UnixNano()%1e9, s.buckets.Add(1))
	if err := s.client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		tb.Fatalf("make bucket %s: %v", name, err)
	}
	return s3.Config{Endpoint: s.Endpoint, Bucket: name, AccessKey: AccessKey, SecretKey: SecretKey, PathStyle: true}
}

// ObjectPath is the file that holds key of bucket in the server's backend
// (tests corrupt objects there, behind the server's back).
func (s *Server) ObjectPath(bucket, key string) string {
	return filepath.Join(s.Dir, bucket, filepath.FromSlash(key))
}

// NodeEnv is the environment that points an aenvd (AENVD_REPOSITORY_*) at
// the bucket c as its snapshot repository.
func NodeEnv(c s3.Config) []string {
	return []string{"AENVD_REPOSITORY_BACKEND=s3", "AENVD_REPOSITORY_ENDPOINT=" + c.Endpoint,
		"AENVD_REPOSITORY_BUCKET=" + c.Bucket, "AENVD_REPOSITORY_ACCESS_KEY=" + c.AccessKey,
		"AENVD_REPOSITORY_SECRET_KEY=" + c.SecretKey, "AENVD_REPOSITORY_PATH_STYLE=true"}
}
