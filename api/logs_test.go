package api

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/wire"
)

func TestReadConsole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	console := "[    0.000000] Linux version 6.12\r\n" +
		`time=2026-01-02T03:04:05.000Z level=INFO msg="aenv-agent listening" addr=0.0.0.0:49983 version=0.6.4` + "\n" +
		"[    1.5] random: crng init done \x1b[0m\x00\n" +
		`time=2026-01-02T03:04:07.5Z level=WARN msg="init: set clock" err="operation \"not\" permitted"` + "\n" +
		"\n"
	if err := os.WriteFile(path, []byte(console), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := readConsole(path, time.Time{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Logs) != 4 || len(out.LogEntries) != 2 {
		t.Fatalf("%d lines, %d entries: %+v", len(out.Logs), len(out.LogEntries), out)
	}
	e := out.LogEntries[0]
	if e.Message != "aenv-agent listening" || e.Level != wire.SandboxLogEntryLevelInfo || e.Fields["version"] != "0.6.4" ||
		!e.Timestamp.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("entry %+v", e)
	}
	if w := out.LogEntries[1]; w.Level != wire.SandboxLogEntryLevelWarn || w.Fields["err"] != `operation "not" permitted` {
		t.Errorf("entry %+v", w)
	}
	if l := out.Logs[2].Line; strings.ContainsAny(l, "\x1b\x00\r") || !out.Logs[2].Timestamp.Equal(out.Logs[1].Timestamp) {
		t.Errorf("kernel line %q at %s: control characters kept, or not timed by the line before", l, out.Logs[2].Timestamp)
	}
	later, _ := readConsole(path, time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC), 1000)
	if len(later.Logs) != 1 || len(later.LogEntries) != 1 || later.LogEntries[0].Message != "init: set clock" {
		t.Errorf("from 03:04:06: %+v", later)
	}
	if last, _ := readConsole(path, time.Time{}, 1); len(last.Logs) != 1 || last.Logs[0].Line != out.Logs[3].Line {
		t.Errorf("limit 1: %+v", last)
	}
	if none, err := readConsole(filepath.Join(t.TempDir(), "gone"), time.Time{}, 10); err != nil || len(none.Logs) != 0 || none.Logs == nil {
		t.Errorf("a missing console: %+v %v", none, err)
	}
}

func TestReadConsoleTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	line := strings.Repeat("x", 1000) + "\n"
	if err := os.WriteFile(path, []byte(strings.Repeat(line, 2*logTailBytes/len(line))), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := readConsole(path, time.Time{}, 100000)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(out.Logs); n == 0 || n > logTailBytes/len(line) {
		t.Errorf("%d lines read of a %d-byte file, want at most the tail's %d", n, 2*logTailBytes, logTailBytes/len(line))
	}
	for _, l := range out.Logs {
		if len(l.Line) != 1000 {
			t.Fatalf("a cut line (%d bytes) was kept", len(l.Line))
		}
	}
}

func FuzzParseSlog(f *testing.F) {
	f.Add(`time=2026-01-02T03:04:05Z level=INFO msg="a b" k=v`)
	f.Add(`time= msg="\x`)
	f.Add(`=x`)
	f.Fuzz(func(t *testing.T, line string) {
		if e, ok := parseSlog(cleanLine(line)); ok && (e.Message == "" || e.Fields == nil) {
			t.Fatalf("parsed %q into %+v", line, e)
		}
	})
}

func TestMergeLogs(t *testing.T) {
	at := func(s string) time.Time { tm, _ := time.Parse(time.RFC3339, s); return tm }
	shared := `time=2026-01-02T03:04:06Z level=INFO msg="process started" pid=7 cmd=bash`
	console := parseLines([]byte("[ 1.0] kernel\n"+shared+"\n"), at("2026-01-02T03:04:00Z"))
	agent := parseLines([]byte(`time=2026-01-02T03:04:05Z level=INFO msg="aenv-agent listening"`+"\n"+shared+"\n"), time.Now())
	out := mergeLogs(console, agent, time.Time{}, 100)
	var lines []string
	for _, l := range out.Logs {
		lines = append(lines, l.Line)
	}
	if len(lines) != 3 || !strings.Contains(lines[0], "kernel") && !strings.Contains(lines[0], "listening") || !strings.Contains(lines[2], "process started") {
		t.Errorf("merged %q: want three lines by time, the shared one once", lines)
	}
	if len(out.LogEntries) != 2 || out.LogEntries[0].Message != "aenv-agent listening" {
		t.Errorf("entries %+v", out.LogEntries)
	}
}
