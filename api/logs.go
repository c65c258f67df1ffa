package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
func (s *Server) GetSandboxLogs(w http.ResponseWriter, r *http.Request, sandboxID SandboxID, params GetSandboxLogsParams) {
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
	out := SandboxLogs{Logs: []SandboxLog{}, LogEntries: []SandboxLogEntry{}}
	if path != "" {
		if out, err = readConsole(path, start, limit); err != nil {
			s.fail(w, r, fmt.Errorf("logs of sandbox %s: %w", sandboxID, err))
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// readConsole reads the tail of a console log into E2B's shapes. A line
// without a time of its own (the kernel's) takes the time of the last
// one before it that had one, or the file's modification time.
func readConsole(path string, start time.Time, limit int) (SandboxLogs, error) {
	out := SandboxLogs{Logs: []SandboxLog{}, LogEntries: []SandboxLogEntry{}}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return out, err
	}
	off := max(0, fi.Size()-logTailBytes)
	buf, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return out, err
	}
	if off > 0 { // the first line is cut: drop it
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	type parsed struct {
		line  string
		entry SandboxLogEntry
		timed bool
	}
	var lines []parsed
	sc := bufio.NewScanner(bytes.NewReader(buf))
	sc.Buffer(make([]byte, 0, 64<<10), len(buf)+1)
	for sc.Scan() {
		if line := cleanLine(sc.Text()); line != "" {
			e, ok := parseSlog(line)
			lines = append(lines, parsed{line, e, ok})
		}
	}
	// An untimed line takes the time of the timed line before it; those
	// before the first timed line take its time (the file's modification
	// time when none has one).
	last := fi.ModTime()
	for _, p := range lines {
		if p.timed {
			last = p.entry.Timestamp
			break
		}
	}
	for _, p := range lines {
		if p.timed {
			last = p.entry.Timestamp
		}
		if last.Before(start) {
			continue
		}
		out.Logs = append(out.Logs, SandboxLog{Timestamp: last, Line: p.line})
		if p.timed {
			out.LogEntries = append(out.LogEntries, p.entry)
		}
	}
	if n := len(out.Logs); n > limit {
		out.Logs = out.Logs[n-limit:]
	}
	if n := len(out.LogEntries); n > limit {
		out.LogEntries = out.LogEntries[n-limit:]
	}
	return out, nil
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
func parseSlog(line string) (SandboxLogEntry, bool) {
	kv := splitLogfmt(line)
	t, err := time.Parse(time.RFC3339Nano, kv["time"])
	if err != nil || kv["msg"] == "" {
		return SandboxLogEntry{}, false
	}
	e := SandboxLogEntry{Timestamp: t, Message: kv["msg"], Level: logLevel(kv["level"]), Fields: map[string]string{}}
	for k, v := range kv {
		if k != "time" && k != "msg" && k != "level" {
			e.Fields[k] = v
		}
	}
	return e, true
}

func logLevel(l string) SandboxLogEntryLevel {
	switch strings.ToUpper(l) {
	case "DEBUG":
		return SandboxLogEntryLevelDebug
	case "WARN":
		return SandboxLogEntryLevelWarn
	case "ERROR":
		return SandboxLogEntryLevelError
	}
	return SandboxLogEntryLevelInfo
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
