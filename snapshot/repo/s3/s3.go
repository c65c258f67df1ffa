// Package s3 is the snapshot repository's backend in any S3-compatible
// object store (AWS S3, versitygw, Ceph RGW, ...), through the minio-go
// client. Objects live under a key prefix in one bucket. A blob is uploaded
// to a staging key first and copied to its final key by the server only after
// its digest was checked, so a partial or wrong upload is never visible under
// a blob's name; small objects (manifests, leases) are single PUTs, which S3
// makes visible whole or not at all.
package s3

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
)

// Config names the bucket and how to reach it.
type Config struct {
	// Endpoint is the store's URL ("http://127.0.0.1:7070",
	// "https://s3.eu-west-1.amazonaws.com"); a bare host[:port] means https.
	Endpoint string
	Bucket   string
	// Prefix is prepended to every key ("aenv/prod"); empty: the bucket root.
	Prefix string
	Region string
	// AccessKey and SecretKey (and SessionToken) authenticate; when empty,
	// the standard AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
	// AWS_SESSION_TOKEN) is used.
	AccessKey    string
	SecretKey    string
	SessionToken string
	// PathStyle addresses the bucket in the path (most self-hosted stores)
	// instead of the host name.
	PathStyle bool
	// MaxRetries bounds the client's own retries of one request; default 3
	// (the uploader retries whole uploads with its own backoff, and a lazy
	// read should fail over to another source soon).
	MaxRetries int
}

// Backend stores objects in a bucket.
type Backend struct {
	c      *minio.Client
	core   minio.Core
	bucket string
	prefix string
	name   string
}

// partSize bounds the memory a multipart upload buffers.
const partSize = 16 << 20

// Open connects to the bucket and checks, once, that the credentials are
// accepted and the bucket exists: a misconfiguration is one clear error here
// rather than failed uploads later.
func Open(ctx context.Context, cfg Config, opt repo.Options) (*repo.Repo, error) {
	b, err := NewBackend(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return repo.New(b, opt), nil
}

// NewBackend returns the backend for cfg after the check of Open.
func NewBackend(ctx context.Context, cfg Config) (*Backend, error) {
	host, secure, err := endpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("open s3 repository at %s: no bucket configured", cfg.Endpoint)
	}
	creds, err := credentialsFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("open s3 repository s3://%s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 3
	}
	c, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: cfg.Region, BucketLookup: lookup,
		MaxRetries: cfg.MaxRetries})
	if err != nil {
		return nil, fmt.Errorf("open s3 repository at %s: %w", cfg.Endpoint, err)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	b := &Backend{c: c, core: minio.Core{Client: c}, bucket: cfg.Bucket, prefix: prefix,
		name: fmt.Sprintf("s3://%s/%s (%s)", cfg.Bucket, prefix, cfg.Endpoint)}
	if err := b.probe(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

func endpoint(s string) (host string, secure bool, err error) {
	if s == "" {
		return "", false, fmt.Errorf("open s3 repository: no endpoint configured")
	}
	if !strings.Contains(s, "://") {
		return s, true, nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("open s3 repository: endpoint %q: want http(s)://host[:port]", s)
	}
	return u.Host, u.Scheme == "https", nil
}

func credentialsFor(cfg Config) (*credentials.Credentials, error) {
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		if cfg.AccessKey == "" || cfg.SecretKey == "" {
			return nil, fmt.Errorf("credentials: access key and secret key must be given together")
		}
		return credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken), nil
	}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" || os.Getenv("AWS_SECRET_ACCESS_KEY") == "" {
		return nil, fmt.Errorf("no credentials: configure an access key and secret key, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	return credentials.NewEnvAWS(), nil
}

// probe asks for the bucket: wrong credentials and a missing bucket each
// get their own message.
func (b *Backend) probe(ctx context.Context) error {
	ok, err := b.c.BucketExists(ctx, b.bucket)
	if err != nil {
		code := minio.ToErrorResponse(err).Code
		switch code {
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken":
			return fmt.Errorf("open s3 repository %s: the store rejected the credentials (%s): %w", b.name, code, err)
		}
		return fmt.Errorf("open s3 repository %s: %w", b.name, err)
	}
	if !ok {
		return fmt.Errorf("open s3 repository %s: bucket %q does not exist", b.name, b.bucket)
	}
	return nil
}

func (b *Backend) String() string { return b.name }

func (b *Backend) key(k string) string { return b.prefix + k }

// notFound maps the store's "no such key" to repo.ErrNotFound.
func notFound(err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.StatusCode == http.StatusNotFound || resp.Code == "NoSuchKey" {
		return fmt.Errorf("%w: %w", repo.ErrNotFound, err)
	}
	return err
}

// Put implements repo.Backend.
func (b *Backend) Put(ctx context.Context, key string, r io.Reader, size int64, check func() error) error {
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", PartSize: partSize}
	if check == nil {
		if _, err := b.c.PutObject(ctx, b.bucket, b.key(key), r, size, opts); err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		return nil
	}
	staging := b.key(stagingPrefix + randomID())
	// The staging object goes in every case (after the copy too); one a
	// failed removal leaves is GC's (CleanStale).
	defer func() {
		_ = b.c.RemoveObject(context.WithoutCancel(ctx), b.bucket, staging, minio.RemoveObjectOptions{})
	}()
	info, err := b.c.PutObject(ctx, b.bucket, staging, r, size, opts)
	if err != nil {
		return fmt.Errorf("put %s (staging): %w", key, err)
	}
	if info.Size != size {
		return fmt.Errorf("put %s: the store took %d of %d bytes", key, info.Size, size)
	}
	if err := check(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	dst := minio.CopyDestOptions{Bucket: b.bucket, Object: b.key(key)}
	src := minio.CopySrcOptions{Bucket: b.bucket, Object: staging}
	if _, err := b.c.ComposeObject(ctx, dst, src); err != nil {
		return fmt.Errorf("put %s (copy from staging): %w", key, err)
	}
	return nil
}

const stagingPrefix = "staging/"

// Get implements repo.Backend. A ranged answer must carry exactly the range
// asked for (Content-Range), or it is an error rather than data.
func (b *Backend) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if n == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	var opts minio.GetObjectOptions
	ranged := off > 0 || n > 0
	if ranged {
		end := int64(0) // "bytes=off-"
		if n > 0 {
			end = off + n - 1
		}
		if err := opts.SetRange(off, end); err != nil {
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
	}
	body, _, hdr, err := b.core.GetObject(ctx, b.bucket, b.key(key), opts)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, notFound(err))
	}
	if ranged {
		if err := checkRange(hdr.Get("Content-Range"), off, n); err != nil {
			body.Close()
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
	}
	return body, nil
}

// checkRange checks a ranged answer: it starts at off and, when n > 0, ends
// where asked or at the object's end.
func checkRange(cr string, off, n int64) error {
	first, last, total, err := blob.ParseContentRange(cr)
	if err != nil {
		return err
	}
	want := off + n - 1
	if first != off || (n > 0 && last != want && !(last == total-1 && want > last)) || (n < 0 && last != total-1) {
		return fmt.Errorf("Content-Range %q answers another range than bytes=%d-%d", cr, off, want)
	}
	return nil
}

// Stat implements repo.Backend.
func (b *Backend) Stat(ctx context.Context, key string) (repo.ObjectInfo, error) {
	info, err := b.c.StatObject(ctx, b.bucket, b.key(key), minio.StatObjectOptions{})
	if err != nil {
		return repo.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, notFound(err))
	}
	return repo.ObjectInfo{Key: key, Size: info.Size, ModTime: info.LastModified}, nil
}

// List implements repo.Backend.
func (b *Backend) List(ctx context.Context, prefix string) ([]repo.ObjectInfo, error) {
	var out []repo.ObjectInfo
	for o := range b.c.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.key(prefix), Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, o.Err)
		}
		if strings.HasSuffix(o.Key, "/") {
			continue // a directory marker some stores show
		}
		out = append(out, repo.ObjectInfo{Key: strings.TrimPrefix(o.Key, b.prefix), Size: o.Size, ModTime: o.LastModified})
	}
	return out, nil
}

// Delete implements repo.Backend.
func (b *Backend) Delete(ctx context.Context, key string) error {
	err := b.c.RemoveObject(ctx, b.bucket, b.key(key), minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(notFound(err), repo.ErrNotFound) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// CleanStale removes staging objects of uploads that died before before
// (repo.StaleCleaner).
func (b *Backend) CleanStale(ctx context.Context, before time.Time) (int, error) {
	objs, err := b.List(ctx, stagingPrefix)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		if o.ModTime.Before(before) {
			if err := b.Delete(ctx, o.Key); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
