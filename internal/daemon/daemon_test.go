package daemon

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	var listen string
	define := func(fs *flag.FlagSet) {
		fs.StringVar(&listen, "listen", EnvOr("AENV_DAEMON_TEST_LISTEN", "127.0.0.1:1"), "")
	}

	t.Setenv("AENV_DAEMON_TEST_LISTEN", "127.0.0.1:2")
	var out bytes.Buffer
	if exit, err := Parse("d", nil, &out, define); exit || err != nil || listen != "127.0.0.1:2" {
		t.Fatalf("no flags: exit %t, err %v, listen %s; want the environment's default", exit, err, listen)
	}
	if exit, err := Parse("d", []string{"--listen", "127.0.0.1:3"}, &out, define); exit || err != nil || listen != "127.0.0.1:3" {
		t.Fatalf("--listen: exit %t, err %v, listen %s", exit, err, listen)
	}
	if exit, err := Parse("d", []string{"--version"}, &out, define); !exit || err != nil || !strings.HasPrefix(out.String(), "d ") {
		t.Fatalf("--version: exit %t, err %v, printed %q", exit, err, out.String())
	}
	if _, err := Parse("d", []string{"--nope"}, &out, define); err == nil || errors.Is(err, flag.ErrHelp) {
		t.Fatalf("an unknown flag: %v, want an error", err)
	}
	if _, err := Parse("d", []string{"-h"}, &out, define); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	t.Setenv("AENV_DAEMON_TEST_LISTEN", "")
	if EnvOr("AENV_DAEMON_TEST_LISTEN", "def") != "def" {
		t.Error("an empty variable did not give the default")
	}
}

func TestSplitList(t *testing.T) {
	if got := SplitList(" a, ,b,,c "); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("SplitList: %q", got)
	}
	if got := SplitList(""); got != nil {
		t.Errorf("SplitList of nothing: %q, want nil", got)
	}
}
