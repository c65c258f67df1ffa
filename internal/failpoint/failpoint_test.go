package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	testPoint  = New("failpoint/test/point")
	crashPoint = New("failpoint/test/crash")
)

func TestArmError(t *testing.T) {
	if err := testPoint.Inject(); err != nil {
		t.Fatalf("unarmed point: %v", err)
	}
	if err := Arm(testPoint.Name(), "error"); err != nil {
		t.Fatal(err)
	}
	defer Arm(testPoint.Name(), "")
	if err := testPoint.Inject(); !errors.Is(err, ErrInjected) {
		t.Fatalf("armed point: %v", err)
	}
}

func TestNthHit(t *testing.T) {
	if err := Arm(testPoint.Name(), "error@3"); err != nil {
		t.Fatal(err)
	}
	defer Arm(testPoint.Name(), "")
	var got []bool
	for range 5 {
		got = append(got, testPoint.Inject() != nil)
	}
	want := []bool{false, false, true, false, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("hits fired %v, want %v", got, want)
		}
	}
}

func TestDelay(t *testing.T) {
	if err := Arm(testPoint.Name(), "delay:30ms"); err != nil {
		t.Fatal(err)
	}
	defer Arm(testPoint.Name(), "")
	start := time.Now()
	if err := testPoint.Inject(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("delay point returned after %v", d)
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{"x", "=crash", "a=boom", "a=crash@0", "a=delay:xyz", "a=error:1"} {
		if _, err := parse(s); err == nil {
			t.Errorf("parse(%q) accepted", s)
		}
	}
	m, err := parse(" a=crash ; b=delay:1s@2;")
	if err != nil || len(m) != 2 || m["b"].nth != 2 || m["b"].delay != time.Second {
		t.Fatalf("parse: %v %+v", err, m)
	}
	if err := Arm("no/such/point", "error"); err == nil {
		t.Fatal("Arm of an undeclared point succeeded")
	}
	if n := Names("failpoint/test/"); len(n) != 2 {
		t.Fatalf("Names: %v", n)
	}
}

// TestCrash arms a point through the environment of a child process and
// checks the child dies of SIGKILL at it, before the line after it runs.
func TestCrash(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := Check(); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(3)
		}
		_ = crashPoint.Inject()
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvVar+"="+crashPoint.Name()+"=crash")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v (%s)", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || strings.Contains(string(out), "survived") {
		t.Fatalf("child did not die of SIGKILL at the point: %v: %s", err, out)
	}

	cmd = exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvVar+"=no/such=crash")
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "undeclared failpoints no/such") {
		t.Fatalf("undeclared armed point not reported: %v: %s", err, out)
	}
}

func TestControlSocket(t *testing.T) {
	path := t.TempDir() + "/fp.sock"
	t.Setenv(ControlEnvVar, path)
	stop, err := ServeControl(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := ArmRemote(path, testPoint.Name(), "error"); err != nil {
		t.Fatal(err)
	}
	if err := testPoint.Inject(); !errors.Is(err, ErrInjected) {
		t.Fatalf("remotely armed point: %v", err)
	}
	if err := ArmRemote(path, testPoint.Name(), ""); err != nil || testPoint.Inject() != nil {
		t.Fatalf("disarm: %v", err)
	}
	if err := ArmRemote(path, "no/such", "crash"); err == nil || !strings.Contains(err.Error(), "not declared") {
		t.Fatalf("arming an undeclared point: %v", err)
	}
}
