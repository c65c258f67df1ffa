package oci

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/oci/unpack"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// FuzzInjectUsers: whatever an image's /etc/passwd, /etc/group and
// /etc/shadow hold, Inject neither panics nor writes outside the root, and
// when it succeeds the databases have root and the default user.
func FuzzInjectUsers(f *testing.F) {
	f.Add("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n", "root:x:0:\nuser:x:1000:\n", "root:*:1:::::\n")
	f.Add("daemon:x:1:1::/:/bin/false\nuser:x:5:5::../../escape:/bin/sh\n", "", "")
	f.Add("user:x:notanumber:x::/etc/passwd:\n:::\n\n", "user:x:99999999999999999999:\n", "user")
	f.Add("", "", "")
	f.Fuzz(func(t *testing.T, passwd, group, shadow string) {
		dir, err := os.MkdirTemp(shmDir(), "fuzz-inject-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		outside := filepath.Join(dir, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := unpack.OpenRoot(filepath.Join(dir, "root"))
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		for p, data := range map[string]string{"/etc/passwd": passwd, "/etc/group": group, "/etc/shadow": shadow} {
			if err := root.WriteFile(p, []byte(data), 0o644, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		err = Inject(root, ConvertOptions{})
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("wrote outside the root: %v", ents)
		}
		if err != nil {
			return
		}
		for p, want := range map[string][]string{"etc/passwd": {"root:", DefaultUser + ":"}, "etc/group": {"root:", DefaultUser + ":"}, "etc/shadow": {"root:", DefaultUser + ":"}} {
			b, _ := os.ReadFile(filepath.Join(root.Path(), p))
			for _, w := range want {
				if !strings.HasPrefix(string(b), w) && !strings.Contains(string(b), "\n"+w) {
					t.Fatalf("%s has no %q line after Inject:\n%s", p, w, b)
				}
			}
		}
	})
}

func shmDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// FuzzLayerOpen: any blob bytes (gzip, zstd, plain or neither) either give
// exactly the stream the diff ID names or an error, never a panic, and
// Close stops the decompressing goroutine even mid-stream.
func FuzzLayerOpen(f *testing.F) {
	want := []byte("hello, layer\n")
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(want)
	gw.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(want)
	zw.Close()
	f.Add(want)
	f.Add(gz.Bytes())
	f.Add(zs.Bytes())
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xff})
	sum := sha256.Sum256(want)
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, blob []byte) {
		p := filepath.Join(dir, "blob")
		if err := os.WriteFile(p, blob, 0o600); err != nil {
			t.Fatal(err)
		}
		rc, err := Layer{Path: p, DiffID: diffID, Digest: diffID}.Open()
		if err != nil {
			return
		}
		got, err := io.ReadAll(io.LimitReader(rc, 1<<20))
		rc.Close()
		if err == nil && len(got) < 1<<20 && !bytes.Equal(got, want) {
			t.Fatalf("a stream of %d bytes that is not the diff ID's passed: %q", len(got), got)
		}
	})
}
