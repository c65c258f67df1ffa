// Package smallroot builds, for tests, a tiny root filesystem layer (an
// uncompressed tar) from this host's files: static busybox with the applets
// template builds use, bash with the libraries ldd names, and /etc/passwd
// and /etc/group with root only (aenvd adds the sandbox user).
package smallroot

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// Layer returns the layer with extra regular files (path → content, mode
// 0644) added; it skips the test when busybox-static is missing.
func Layer(t testing.TB, extra map[string]string) []byte {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		testenv.Missing(t, "busybox-static is not installed (CI installs it)")
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(h *tar.Header, data []byte) {
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	hostFile := func(name, src string) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		add(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755}, data)
	}
	for _, d := range []string{"bin", "etc", "lib", "lib/x86_64-linux-gnu", "lib64", "root", "home", "proc", "sys", "dev", "run", "usr", "usr/bin"} {
		add(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	add(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil)
	hostFile("bin/busybox", busybox)
	for _, a := range []string{"sh", "mkdir", "chown", "chmod", "id", "tar", "cat", "ls", "rm", "true", "false", "sleep", "echo",
		"pwd", "test", "stat", "env", "mktemp", "whoami", "printf", "grep", "ps", "touch"} {
		add(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	hostFile("bin/bash", "/bin/bash")
	out, err := exec.Command("ldd", "/bin/bash").Output()
	if err != nil {
		t.Fatalf("ldd /bin/bash: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0]
		default:
			continue
		}
		dst := strings.TrimPrefix(lib, "/")
		if strings.HasPrefix(dst, "usr/lib/") { // merged /usr: the image has /lib only
			dst = strings.TrimPrefix(dst, "usr/")
		}
		hostFile(dst, lib)
	}
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:\n"))
	for name, content := range extra {
		add(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, []byte(content))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
