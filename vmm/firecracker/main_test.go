package firecracker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the firecracker and jailer
// executables: a wrapper script (see fakeExecutable) sets FAKEFC_ROLE and
// re-executes this binary.
func TestMain(m *testing.M) {
	switch os.Getenv("FAKEFC_ROLE") {
	case "firecracker":
		os.Exit(fakeFirecrackerMain(os.Args[1:], ""))
	case "jailer":
		os.Exit(fakeJailerMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// logCall appends one line to the FAKEFC_LOG file.
func logCall(c call) {
	path := os.Getenv("FAKEFC_LOG")
	if path == "" {
		return
	}
	b, _ := json.Marshal(c)
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.Write(append(b, '\n'))
		_ = f.Close()
	}
}

// fakeFirecrackerMain accepts Firecracker's --api-sock and --id, rejects any
// other argument as Firecracker does, and serves the fake API until killed.
// FAKEFC_MODE selects a misbehaviour: "die-on-start" exits when the guest
// should start, "no-socket" never opens the API socket.
func fakeFirecrackerMain(args []string, root string) int {
	if len(args) == 1 && args[0] == "--version" {
		fmt.Println("Firecracker v0.0.0-fake")
		fmt.Println()
		return 0
	}
	var sock, id string
	seen := map[string]bool{}
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		switch name {
		case "--api-sock", "--id", "--start-time-us", "--start-time-cpu-us":
		default:
			fmt.Fprintf(os.Stderr, "error: unknown argument %q\n", args[i])
			return 1
		}
		if seen[name] {
			fmt.Fprintf(os.Stderr, "error: argument %s given more than once\n", name)
			return 1
		}
		seen[name] = true
		if !hasVal {
			if i+1 >= len(args) {
				fmt.Fprintf(os.Stderr, "error: %s needs a value\n", name)
				return 1
			}
			i++
			val = args[i]
		}
		switch name {
		case "--api-sock":
			sock = val
		case "--id":
			id = val
		}
	}
	if id != "" && !jailerID.MatchString(id) {
		fmt.Fprintf(os.Stderr, "error: invalid instance id %q\n", id)
		return 1
	}
	netns, _ := os.Readlink("/proc/self/ns/net")
	logCall(call{Method: "EXEC", Path: "firecracker", Body: map[string]any{"pid": os.Getpid(), "id": id, "sock": sock, "netns": netns}})
	mode := os.Getenv("FAKEFC_MODE")
	if sock == "" {
		fmt.Fprintln(os.Stderr, "error: --api-sock is required")
		return 1
	}
	if mode == "no-socket" {
		select {}
	}
	f := newFakeVMM(root, os.Stdout)
	f.logPath = os.Getenv("FAKEFC_LOG")
	f.dieOn = map[string]string{"die-on-start": "InstanceStart"}[mode]
	f.openTaps = mode == "open-taps"
	if _, _, err := serveFake(f.host(sock), f); err != nil {
		fmt.Fprintf(os.Stderr, "error: api socket: %v\n", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return 0
}

// fakeJailerMain checks the jailer's arguments, records them, and runs the
// fake Firecracker with paths resolved inside the chroot it would use.
func fakeJailerMain(args []string) int {
	vals := map[string][]string{}
	var rest []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			rest = args[i+1:]
			break
		}
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok || i+1 >= len(args) {
			fmt.Fprintf(os.Stderr, "jailer: bad argument %q\n", args[i])
			return 1
		}
		vals[name] = append(vals[name], args[i+1])
		i++
	}
	known := map[string]bool{"id": true, "exec-file": true, "uid": true, "gid": true, "chroot-base-dir": true,
		"netns": true, "cgroup-version": true, "parent-cgroup": true, "cgroup": true}
	for name := range vals {
		if !known[name] {
			fmt.Fprintf(os.Stderr, "jailer: unknown argument --%s\n", name)
			return 1
		}
	}
	for _, req := range []string{"id", "exec-file", "uid", "gid"} {
		if len(vals[req]) != 1 {
			fmt.Fprintf(os.Stderr, "jailer: --%s is required once\n", req)
			return 1
		}
	}
	exe := vals["exec-file"][0]
	if st, err := os.Stat(exe); err != nil || !filepath.IsAbs(exe) || st.IsDir() {
		fmt.Fprintf(os.Stderr, "jailer: exec file %q must be an absolute path to a file\n", exe)
		return 1
	}
	base := "/srv/jailer"
	if v := vals["chroot-base-dir"]; len(v) > 0 {
		base = v[0]
	}
	root := filepath.Join(base, filepath.Base(exe), vals["id"][0], "root")
	body := map[string]any{}
	for k, v := range vals {
		body[k] = v
	}
	if !jailerID.MatchString(vals["id"][0]) {
		fmt.Fprintf(os.Stderr, "jailer: invalid id %q\n", vals["id"][0])
		return 1
	}
	if !strings.Contains(filepath.Base(exe), "firecracker") {
		fmt.Fprintf(os.Stderr, "jailer: exec file name must contain firecracker\n")
		return 1
	}
	logCall(call{Method: "EXEC", Path: "jailer", Body: body})
	// Like the jailer, pass the id and start times before the caller's arguments.
	fcArgs := append([]string{"--id=" + vals["id"][0], "--start-time-us=1", "--start-time-cpu-us=1"}, rest...)
	return fakeFirecrackerMain(fcArgs, root)
}

// fakeExecutable writes a script that runs this test binary in role with
// mode and returns its path and the path of its call log.
func fakeExecutable(t *testing.T, name, role, mode string) (exe, log string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	exe = filepath.Join(dir, name)
	log = filepath.Join(dir, "calls.jsonl")
	// exec keeps the shell's pid, so the pid file names the fake VMM even
	// when it is killed before it could log anything.
	script := fmt.Sprintf("#!/bin/sh\necho $$ >%s\nFAKEFC_ROLE=%s FAKEFC_MODE=%s FAKEFC_LOG=%s exec %s \"$@\"\n",
		filepath.Join(dir, "pid"), role, mode, log, self)
	writeExecutable(t, exe, script)
	return exe, log
}

// readCalls reads a call log written by a fake process.
func readCalls(t *testing.T, path string) []call {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("call log: %v", err)
	}
	defer f.Close()
	var out []call
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var c call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("call log line %q: %v", sc.Text(), err)
		}
		out = append(out, c)
	}
	return out
}

// fakePID returns the pid of the fake started by the executable whose call
// log is log.
func fakePID(t *testing.T, log string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(log), "pid"))
	if err != nil {
		t.Fatalf("fake firecracker never started: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// processGone reports whether pid no longer exists (waiting briefly, since
// the driver reaps it asynchronously).
func processGone(pid int) bool {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// writeExecutable writes a script that the test execs soon after. It holds
// syscall.ForkLock while the file is open for writing: a fork by a parallel
// test would otherwise inherit the write descriptor until its exec, and our
// own exec of the script would fail with "text file busy" (ETXTBSY).
func writeExecutable(t testing.TB, path, script string) {
	t.Helper()
	syscall.ForkLock.Lock()
	err := os.WriteFile(path, []byte(script), 0o755)
	syscall.ForkLock.Unlock()
	if err != nil {
		t.Fatal(err)
	}
}
