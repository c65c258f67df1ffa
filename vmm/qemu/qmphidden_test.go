package qemu

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestQMPSocketPathHidden: the QMP socket a start listens on lies in the
// sandbox's run directory (whose path holds the sandbox id), yet
// /proc/net/unix, which every local user reads, does not show that path;
// a client still connects at the path.
func TestQMPSocketPathHidden(t *testing.T) {
	const id = "secretsandboxid0123x"
	dir := filepath.Join(t.TempDir(), "sandboxes", id, "run-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(dir, "mem")
	if err := os.WriteFile(mem, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "qmp.sock")
	h, err := openHanded(sock, filepath.Join(dir, "console.log"), memorySource{path: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatalf("read /proc/net/unix: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, id) {
			t.Fatalf("/proc/net/unix shows the sandbox id: %s", line)
		}
	}
	if st, err := os.Stat(sock); err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket file at %s: %v %v", sock, st, err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connect at the socket's path: %v", err)
	}
	c.Close()
}
