package s3_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
)

func TestConformance(t *testing.T) {
	srv := s3test.Start(t)
	repotest.Run(t, func(t *testing.T) repo.Backend {
		cfg := srv.Bucket(t)
		if t.Name() != "" && strings.Contains(t.Name(), "Ranges") {
			cfg.Prefix = "some/prefix" // one check runs under a key prefix
		}
		b, err := s3.NewBackend(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestOpenErrors: a wrong secret, an unknown bucket, missing credentials and
// a bad endpoint are each one clear error at open.
func TestOpenErrors(t *testing.T) {
	srv := s3test.Start(t)
	good := srv.Bucket(t)
	ctx := context.Background()
	if _, err := s3.Open(ctx, good, repo.Options{}); err != nil {
		t.Fatalf("open with good settings: %v", err)
	}
	badSecret := good
	badSecret.SecretKey = "wrong-secret-wrong-secret"
	noBucket := good
	noBucket.Bucket = "no-such-bucket"
	noCreds := good
	noCreds.AccessKey, noCreds.SecretKey = "", ""
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	badEndpoint := good
	badEndpoint.Endpoint = "ftp://x"
	cases := map[string]struct {
		cfg  s3.Config
		want string
	}{
		"wrong secret":   {badSecret, "rejected the credentials"},
		"unknown bucket": {noBucket, `bucket "no-such-bucket" does not exist`},
		"no credentials": {noCreds, "no credentials"},
		"bad endpoint":   {badEndpoint, "want http(s)://host[:port]"},
	}
	for name, c := range cases {
		_, err := s3.Open(ctx, c.cfg, repo.Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: open error %v, want one saying %q", name, err, c.want)
		}
	}
}

// TestEnvironmentCredentials: without configured keys, the standard AWS
// environment variables authenticate.
func TestEnvironmentCredentials(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	t.Setenv("AWS_ACCESS_KEY_ID", cfg.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", cfg.SecretKey)
	cfg.AccessKey, cfg.SecretKey = "", ""
	r, err := s3.Open(context.Background(), cfg, repo.Options{})
	if err != nil {
		t.Fatalf("open with environment credentials: %v", err)
	}
	repotest.PutRandom(t, r, 1, 100)
}
