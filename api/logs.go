package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentenv/agentenv/api/wire"
)

// Sandbox logs (E2B's GET /sandboxes/{id}/logs): the recent lines of the
// guest console, which carries the kernel's messages and the guest agent's
// structured log (log/slog text lines, parsed into logEntries).

// logTailBytes bounds how much of a console log one request reads.
const logTailBytes = 256 << 10

// maxLogLine bounds one line (longer ones are cut).
const maxLogLine = 4 << 10

// GetSandboxLogs implements ServerInterface: the console's lines from
// start (unix milliseconds) on, at most limit (default 1000), oldest first.
func (s *Server) GetSandboxLogs(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID, params wire.GetSandboxLogsParams) {
	path, err := s.o.ConsoleLog(sandboxID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := 1000
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 10000 {
			writeError(w, http.StatusBadRequest, "limit must be within 1..10000")
			return
		}
		limit = int(*params.Limit)
	}
	var start time.Time
	if params.Start != nil {
		start = time.UnixMilli(*params.Start)
	}
	var console []byte
	var modTime time.Time
	if path != "" {
		if console, modTime, err = readTail(path); err != nil {
			s.fail(w, r, fmt.Errorf("logs of sandbox %s: %w", sandboxID, err))
			return
		}
	}
	agentLines, err := s.o.AgentLogs(r.Context(), sandboxID)
	if err != nil {
		s.log.Debug("agent logs", "sandbox", sandboxID, "err", err) // the console's lines still answer
	}
	writeJSON(w, http.StatusOK, mergeLogs(parseLines(console, modTime), parseLines(agentLines, time.Now()), start, limit))
}

// readTail reads the last logTailBytes of a file (its first, cut line
// dropped) and its modification time; a missing file reads as empty.
func readTail(path string) ([]byte, time.Time, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, err
	}
	off := max(0, fi.Size()-logTailBytes)
	buf, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return nil, time.Time{}, err
	}
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	return buf, fi.ModTime(), nil
}

// logLine is one parsed line and its time.
type logLine struct {
	at    time.Time
	line  string
	entry *wire.SandboxLogEntry
}

// parseLines parses log text. An untimed line takes the time of the timed
// line before it; those before the first timed line take its time (else
// fallback).
func parseLines(buf []byte, fallback time.Time) []logLine {
	var lines []logLine
	sc := bufio.NewScanner(bytes.NewReader(buf))
	sc.Buffer(make([]byte, 0, 64<<10), len(buf)+1)
	for sc.Scan() {
		if line := cleanLine(sc.Text()); line != "" {
			l := logLine{line: line}
			if e, ok := parseSlog(line); ok {
				l.entry, l.at = &e, e.Timestamp
			}
			lines = append(lines, l)
		}
	}
	last := fallback
	for _, l := range lines {
		if l.entry != nil {
			last = l.at
			break
		}
	}
	for i := range lines {
		if lines[i].entry != nil {
			last = lines[i].at
		}
		lines[i].at = last
	}
	return lines
}

// mergeLogs interleaves sources by time (a line the agent also wrote to
// the console appears once), keeps those from start on, and the newest
// limit of each shape.
func mergeLogs(console, agent []logLine, start time.Time, limit int) wire.SandboxLogs {
	out := wire.SandboxLogs{Logs: []wire.SandboxLog{}, LogEntries: []wire.SandboxLogEntry{}}
	onConsole := map[string]bool{}
	for _, l := range console {
		onConsole[l.line] = true
	}
	all := append([]logLine(nil), console...)
	for _, l := range agent {
		if !onConsole[l.line] { // the agent's stderr is the console too
			all = append(all, l)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	for _, l := range all {
		if l.at.Before(start) {
			continue
		}
		out.Logs = append(out.Logs, wire.SandboxLog{Timestamp: l.at, Line: l.line})
		if l.entry != nil {
			out.LogEntries = append(out.LogEntries, *l.entry)
		}
	}
	if n := len(out.Logs); n > limit {
		out.Logs = out.Logs[n-limit:]
	}
	if n := len(out.LogEntries); n > limit {
		out.LogEntries = out.LogEntries[n-limit:]
	}
	return out
}

// readConsole reads a console log file into E2B's shapes.
func readConsole(path string, start time.Time, limit int) (wire.SandboxLogs, error) {
	buf, mod, err := readTail(path)
	if err != nil {
		return wire.SandboxLogs{Logs: []wire.SandboxLog{}, LogEntries: []wire.SandboxLogEntry{}}, err
	}
	return mergeLogs(parseLines(buf, mod), nil, start, limit), nil
}

// cleanLine trims a console line (CR, control characters, invalid UTF-8)
// and bounds its length.
func cleanLine(l string) string {
	l = strings.ToValidUTF8(strings.TrimRight(l, "\r"), "?")
	l = strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' {
			return -1
		}
		return r
	}, l)
	if len(l) > maxLogLine {
		l = l[:maxLogLine]
		for !utf8.ValidString(l) {
			l = l[:len(l)-1]
		}
	}
	return strings.TrimSpace(l)
}

// parseSlog reads a log/slog text line (time=... level=... msg=... k=v).
func parseSlog(line string) (wire.SandboxLogEntry, bool) {
	kv := splitLogfmt(line)
	t, err := time.Parse(time.RFC3339Nano, kv["time"])
	if err != nil || kv["msg"] == "" {
		return wire.SandboxLogEntry{}, false
	}
	e := wire.SandboxLogEntry{Timestamp: t, Message: kv["msg"], Level: logLevel(kv["level"]), Fields: map[string]string{}}
	for k, v := range kv {
		if k != "time" && k != "msg" && k != "level" {
			e.Fields[k] = v
		}
	}
	return e, true
}

func logLevel(l string) wire.SandboxLogEntryLevel {
	switch strings.ToUpper(l) {
	case "DEBUG":
		return wire.SandboxLogEntryLevelDebug
	case "WARN":
		return wire.SandboxLogEntryLevelWarn
	case "ERROR":
		return wire.SandboxLogEntryLevelError
	}
	return wire.SandboxLogEntryLevelInfo
}

// splitLogfmt splits key=value pairs; values may be double-quoted with
// Go escapes.
func splitLogfmt(line string) map[string]string {
	kv := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 || strings.ContainsAny(line[:eq], " \"") {
			return kv
		}
		key, rest := line[:eq], line[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return kv
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, " ")
		}
		kv[key] = val
		line = rest
	}
	return kv
}
