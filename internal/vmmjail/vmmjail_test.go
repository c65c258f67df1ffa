package vmmjail

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("building a jail (mounts, pivot_root) needs root")
	}
}

// run starts a program in a jail and returns its stdout, stderr and error.
func run(t *testing.T, s Spec) (string, string, error) {
	t.Helper()
	cmd, err := Command(s)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// TestJailHoldsOnlyWhatItNeeds: a program in a jail sees the system's
// program directories, /proc, a few devices and the paths it was given,
// and nothing else of the host: the mount table of its namespace lists
// exactly those, the root holds nothing more, and the host's own files
// (this test's other files, /etc, /var) are absent.
func TestJailHoldsOnlyWhatItNeeds(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	given := filepath.Join(dir, "given")
	secret := filepath.Join(dir, "secret")
	for _, p := range []string{given, secret} {
		if err := os.WriteFile(p, []byte(filepath.Base(p)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, err := run(t, Spec{
		Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/self/mountinfo; echo ---; ls -a /; echo ---; cat " + given + "; echo; cat " + secret + " /etc/hostname /etc/passwd 2>&1; echo; ls /var 2>&1; true"},
		Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", Binds: []Bind{{Path: given}},
	})
	if err != nil {
		t.Fatalf("jailed sh: %v\n%s", err, errOut)
	}
	parts := strings.Split(out, "---\n")
	if len(parts) != 3 {
		t.Fatalf("output: %q", out)
	}
	var mounts []string
	for _, line := range strings.Split(strings.TrimSpace(parts[0]), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			mounts = append(mounts, f[4])
		}
	}
	sort.Strings(mounts)
	allowed := map[string]bool{"/": true, "/proc": true, given: true, "/etc/ld.so.cache": true}
	for _, p := range append(systemPaths(), devices...) {
		allowed[p] = true
	}
	for _, m := range mounts {
		if !allowed[m] && !strings.HasPrefix(m, "/usr/") {
			t.Errorf("the jail's namespace has a mount at %s (all: %v)", m, mounts)
		}
	}
	for _, want := range []string{"/", "/usr", "/proc", given, "/dev/null"} {
		if !contains(mounts, want) {
			t.Errorf("the jail's namespace lacks %s (all: %v)", want, mounts)
		}
	}
	for _, name := range strings.Fields(parts[1]) {
		switch name {
		case ".", "..", "usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "proc", "dev", strings.Split(dir, "/")[1]:
		default:
			t.Errorf("the jail's root holds %q (all: %q)", name, parts[1])
		}
	}
	rest := parts[2]
	if !strings.HasPrefix(rest, "given\n") {
		t.Errorf("the given file does not read back: %q", rest)
	}
	if strings.Contains(rest, "secret\n") || strings.Contains(rest, "root:x:0") {
		t.Errorf("a file of the host that was not given is readable in the jail: %q", rest)
	}
	if !strings.Contains(rest, "No such file") {
		t.Errorf("reads of files not given did not fail with ENOENT: %q", rest)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("the host's file is gone after the jail's tmpfs came and went: %v", err)
	}
}

// TestJailBindsReadOnlyUnlessWritable: a read-only path refuses writes, a
// writable one takes them, and the root itself is read-only.
func TestJailBindsReadOnlyUnlessWritable(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	ro, rw := filepath.Join(dir, "ro"), filepath.Join(dir, "rw")
	for _, p := range []string{ro, rw} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := "touch " + ro + "/x 2>/dev/null && echo ro-written; touch " + rw + "/x && echo rw-written; touch /new 2>/dev/null && echo root-written; true"
	out, errOut, err := run(t, Spec{
		Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: rw,
		Binds: []Bind{{Path: ro}, {Path: rw, Writable: true}},
	})
	if err != nil {
		t.Fatalf("jailed sh: %v\n%s", err, errOut)
	}
	if strings.TrimSpace(out) != "rw-written" {
		t.Fatalf("writes in the jail: %q, want only the writable bind's", out)
	}
	if _, err := os.Stat(filepath.Join(rw, "x")); err != nil {
		t.Fatalf("the write through the writable bind did not reach the host: %v", err)
	}
}

// TestJailFailsClearly: a jail naming a path that does not exist does not
// start the program and says which path.
func TestJailFailsClearly(t *testing.T) {
	needRoot(t)
	missing := filepath.Join(t.TempDir(), "missing")
	_, errOut, err := run(t, Spec{Path: "/bin/true", Args: []string{"true"}, Dir: "/", Binds: []Bind{{Path: missing}}})
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 126 || !strings.Contains(errOut, missing) {
		t.Fatalf("err %v, stderr %q: want exit 126 naming %s", err, errOut, missing)
	}
	if _, err := Command(Spec{Path: "true", Dir: "/"}); err == nil {
		t.Fatal("a relative binary was accepted")
	}
	if _, err := Command(Spec{Path: "/bin/true", Dir: "/", Binds: []Bind{{Path: "/a/../b"}}}); err == nil {
		t.Fatal("an unclean bind path was accepted")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestOwnNetwork: a program jailed with OwnNetwork sees no interface but a
// loopback device and cannot connect to a listener on the host's loopback;
// the same program jailed without it can (so the check can fail).
func TestOwnNetwork(t *testing.T) {
	needRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo ---; readlink /proc/self/ns/net; "+
		"(echo > /dev/tcp/127.0.0.1/%d) 2>/dev/null && echo connected; true", port)
	jailed := func(own bool) (ifaces []string, ns string, connected bool) {
		out, errOut, err := run(t, Spec{Path: "/bin/bash", Args: []string{"bash", "-c", script},
			Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", OwnNetwork: own})
		if err != nil {
			t.Fatalf("jailed bash (own network %v): %v\n%s", own, err, errOut)
		}
		parts := strings.SplitN(out, "---\n", 2)
		if len(parts) != 2 {
			t.Fatalf("output: %q", out)
		}
		rest := strings.Fields(parts[1])
		return strings.Fields(parts[0]), rest[0], slices.Contains(rest, "connected")
	}
	hostNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if _, ns, connected := jailed(false); ns != hostNS || !connected {
		t.Fatalf("without OwnNetwork: namespace %s (host %s), connected %v: want the host's network", ns, hostNS, connected)
	}
	ifaces, ns, connected := jailed(true)
	if ns == hostNS {
		t.Errorf("with OwnNetwork the program runs in the host's network namespace %s", ns)
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("with OwnNetwork the program sees interfaces %v, want only lo", ifaces)
	}
	if connected {
		t.Errorf("with OwnNetwork the program connected to the host's 127.0.0.1:%d", port)
	}
}

// TestJailLeavesOutMountsBelowABind: a directory given to the jail comes
// without what is mounted below it (the storage daemon's FUSE mount of
// memory exports lies below a VMM's socket directory; a recursive bind
// carried it into every VMM's namespace).
func TestJailLeavesOutMountsBelowABind(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(sub, syscall.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(sub, "inner"), []byte("inner"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := run(t, Spec{
		Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/self/mountinfo; echo ---; ls -a " + sub},
		Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", Binds: []Bind{{Path: dir}},
	})
	if err != nil {
		t.Fatalf("jailed sh: %v\n%s", err, errOut)
	}
	mounts, listing, _ := strings.Cut(out, "---\n")
	if strings.Contains(mounts, " "+sub+" ") {
		t.Errorf("the jail's namespace has the mount below its bind at %s:\n%s", sub, mounts)
	}
	if !strings.Contains(mounts, " "+dir+" ") {
		t.Errorf("the jail's namespace lacks the bound directory %s:\n%s", dir, mounts)
	}
	if strings.Contains(listing, "inner") {
		t.Errorf("the jail sees the file of the mount below its bind: %q", listing)
	}
}
