// Command testsum reads `go test -json` events and keeps the plain output
// readable: it prints what `go test` without -v prints (each package's ok or
// FAIL line, the output of failed tests, build errors) while the run goes, and
// at the end the skipped tests with their reasons. make test pipes each pass
// through it (and saves the raw events with tee):
//
//	go test -json ./... | tee unit.json | go run ./internal/testenv/testsum
//	go run ./internal/testenv/testsum -report unit.json race.json
//
// Its exit status is 1 when a test or package failed, so a pipeline with
// pipefail fails as `go test` would.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// skip is one skipped test and the message it skipped with.
type skip struct {
	Package, Test, Reason string
}

// summary collects a run: the output buffered per running test, the skips
// and whether anything failed.
type summary struct {
	out    io.Writer
	quiet  bool // report mode: print nothing while reading
	buf    map[string][]string
	skips  []skip
	failed bool
}

func newSummary(out io.Writer, quiet bool) *summary {
	return &summary{out: out, quiet: quiet, buf: map[string][]string{}}
}

func (s *summary) print(line string) {
	if !s.quiet {
		fmt.Fprint(s.out, line)
	}
}

// add handles one event.
func (s *summary) add(e event) {
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		s.print(e.Output)
	case e.Action == "build-fail":
		s.failed = true
	case e.Test == "" && e.Action == "output":
		// Package lines: "ok  pkg 1.2s", "FAIL pkg", panics outside tests.
		if t := strings.TrimSpace(e.Output); t != "PASS" && t != "FAIL" && !strings.HasPrefix(t, "=== ") {
			s.print(e.Output)
		}
	case e.Test == "" && e.Action == "fail":
		s.failed = true
	case e.Action == "output":
		s.buf[key] = append(s.buf[key], e.Output)
	case e.Action == "fail":
		s.failed = true
		s.printFailed(s.buf[key])
		delete(s.buf, key)
	case e.Action == "skip":
		s.skips = append(s.skips, skip{e.Package, e.Test, reason(s.buf[key])})
		delete(s.buf, key)
	case e.Action == "pass":
		delete(s.buf, key)
	}
}

// reason is the skip message in a skipped test's output: what it logged,
// without the "=== RUN" and "--- SKIP" lines (the last three lines at most).
func reason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		msg = append(msg, t)
	}
	if len(msg) > 3 {
		msg = msg[len(msg)-3:]
	}
	if len(msg) == 0 {
		return "(no message)"
	}
	return strings.Join(msg, " / ")
}

// printFailed prints a failed test's output as plain go test does: its
// "--- FAIL" line first, then what it logged.
func (s *summary) printFailed(lines []string) {
	var rest []string
	for _, l := range lines {
		switch t := strings.TrimSpace(l); {
		case strings.HasPrefix(t, "=== "):
		case strings.HasPrefix(t, "--- FAIL"):
			s.print(l)
		default:
			rest = append(rest, l)
		}
	}
	for _, l := range rest {
		s.print(l)
	}
}

// read feeds every event of r to s; lines that are not JSON (go test's own
// errors) are printed as they are.
func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			s.print(sc.Text() + "\n")
			continue
		}
		if e.Package == "" {
			e.Package = e.ImportPath
		}
		s.add(e)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read test events: %w", err)
	}
	return nil
}

// report prints the count of skipped tests and, with list, each one and
// its reason.
func (s *summary) report(w io.Writer, label string, list bool) {
	fmt.Fprintf(w, "\n== skipped tests (%s): %d\n", label, len(s.skips))
	if !list {
		return
	}
	for _, k := range s.skips {
		fmt.Fprintf(w, "SKIP %s %s: %s\n", strings.TrimPrefix(k.Package, "github.com/agentenv/agentenv/"), k.Test, k.Reason)
	}
}

func main() {
	reportOnly := flag.Bool("report", false, "read the named files of saved events and print only the skipped tests")
	flag.Parse()
	if !*reportOnly {
		s := newSummary(os.Stdout, false)
		if err := s.read(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "testsum:", err)
			os.Exit(2)
		}
		s.report(os.Stdout, "this pass; listed by testsum -report at the end of make test", false)
		if s.failed {
			os.Exit(1)
		}
		return
	}
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsum: open events %s: %v\n", name, err)
			os.Exit(2)
		}
		s := newSummary(io.Discard, true)
		err = s.read(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsum: %s: %v\n", name, err)
			os.Exit(2)
		}
		s.report(os.Stdout, name, true)
	}
}
