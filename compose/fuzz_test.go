package compose

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// maxParseAlloc bounds what one Parse may allocate: the parser's nodes for
// maxStructure structural characters, its buffers for MaxFileBytes, the
// walk's refusals and Project.File. The worst cases measured
// (TestParseAllocationWorstCases: mappings of maxStructure/2 keys padded
// to MaxFileBytes) allocate about 31 MiB.
const maxParseAlloc = 64 << 20

// hostileSeeds are the fuzz corpus's starting points: files that try each
// refusal, the bounds and the parser's corners.
var hostileSeeds = []string{
	twoServices,
	"services:\n  web:\n    image: alpine\n    privileged: true\n",
	"services:\n  web:\n    image: alpine\n    volumes: [\"/:/host\", {type: bind, source: /, target: /h}]\n",
	"x-a: &a [x, x, x, x, x, x, x, x]\nx-b: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nx-c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nservices: {w: {image: alpine, command: *c}}\n",
	"x-a: &a [*a]\nservices: {a: {image: alpine}}\n",
	"x-p: &p {privileged: true, <<: *p}\nservices:\n  w:\n    <<: [*p, *p]\n    image: alpine\n",
	"services:\n  w:\n    image: alpine\n---\nservices:\n  w:\n    image: alpine\n    pid: host\n",
	"services:\n  w:\n    image: ${X:-alpine}\n    network_mode: host\n    security_opt: [seccomp=unconfined]\n",
	"services: {w: {image: alpine, ports: [\"[::1]:80:80/udp\", {target: 0}], command: !reset []}}\n",
	"? [a, b]\n: c\nservices: {w: {image: alpine}}\n",
	"\xef\xbb\xbfservices: {w: {image: alpine}}\n",
	"services: {w: {image: alpine, environment: {A: !!binary aGVsbG8=}}}\n",
	"x: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n",
	"services:\n  w:\n    image: alpine\n    volumes: [\"C:\\\\x:/y\", \"data:rel\", \":/x\"]\n",
}

// FuzzParse: whatever the file, Parse neither panics nor allocates beyond
// maxParseAlloc; an accepted project has 1..MaxServices services, each
// with an image; a refusal is Errors, each with a reason.
func FuzzParse(f *testing.F) {
	for _, s := range hostileSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		p, err := Parse(data)
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > maxParseAlloc {
			t.Fatalf("Parse of %d bytes allocated %d bytes, more than %d", len(data), d, maxParseAlloc)
		}
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 || len(es) > maxErrors {
				t.Fatalf("refusal is not 1..%d Errors: %T %v", maxErrors, err, err)
			}
			for _, e := range es {
				if e.Reason == "" {
					t.Fatalf("refusal without a reason at %q", e.Path)
				}
			}
			return
		}
		if len(p.Services) < 1 || len(p.Services) > MaxServices {
			t.Fatalf("accepted %d services", len(p.Services))
		}
		for _, s := range p.Services {
			if s.Image == "" || s.Name == "" {
				t.Fatalf("accepted service %+v", s)
			}
		}
		checkFixedPoint(t, p)
	})
}

// keys repeats format with distinct numbers.
func keys(format string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, format, i)
	}
	return b.String()
}

// checkFixedPoint: an accepted file's Project.File is accepted as the same
// project and renders to itself, unless it is over a whole-file bound (an
// alias expanded can make it larger than the file).
func checkFixedPoint(t *testing.T, p *Project) {
	t.Helper()
	again, err := Parse(p.File)
	if err != nil {
		var es Errors
		if errors.As(err, &es) && len(es) == 1 && (es[0].Path == "" || strings.Contains(es[0].Reason, "expands to more than")) {
			return
		}
		t.Fatalf("Project.File refused: %v\n%s", err, p.File)
	}
	// JSON objects have no order: the services come back sorted by name.
	byName := func(a, b Service) int { return strings.Compare(a.Name, b.Name) }
	want := slices.SortedFunc(slices.Values(p.Services), byName)
	if !bytes.Equal(again.File, p.File) || !reflect.DeepEqual(slices.SortedFunc(slices.Values(again.Services), byName), want) {
		t.Fatalf("Project.File is not a fixed point:\n%s\n%s", p.File, again.File)
	}
}

// TestParseAllocationWorstCases: accepted files that make the parser
// allocate the most per byte, at the bounds, stay within maxParseAlloc
// through every pass (parse, checks, Project.File).
func TestParseAllocationWorstCases(t *testing.T) {
	pad := func(s string) []byte {
		s += "services: {a: {image: alpine}}\n#"
		return []byte(s + strings.Repeat("x", MaxFileBytes-len(s)))
	}
	n := maxStructure - 200
	cases := map[string][]byte{
		"flow sequence": pad("x-a: [" + strings.Repeat("a,", n/2) + "a]\n"),
		"flow mapping":  pad("x-a: {" + keys("k%d: b,", n/2) + "a: b}\n"),
		"block mapping": pad("x-a:\n" + keys(" k%d:\n", n/2)),
		"long scalar":   pad("x-a: " + strings.Repeat("y", MaxFileBytes/2) + "\n"),
		"many aliases":  pad("x-a: &a [x]\nx-b: [" + strings.Repeat("*a,", n/2) + "*a]\n"),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if len(data) != MaxFileBytes {
				t.Fatalf("case is %d bytes, want %d", len(data), MaxFileBytes)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse(data)
			runtime.ReadMemStats(&after)
			d := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %d MiB", d>>20)
			if err != nil { // accepted: every pass ran
				t.Errorf("Parse: %v", err)
			}
			if d > maxParseAlloc {
				t.Fatalf("allocated %d bytes, more than %d", d, maxParseAlloc)
			}
		})
	}
}
