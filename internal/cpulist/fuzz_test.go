package cpulist

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzParse: any input either parses to a list whose canonical form parses
// back to the same CPUs (and is its own canonical form), or is refused
// with ErrSyntax; nothing panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "0", "0-1,3", "3,0-1", "1-", "-", ",", "0-1,1", "1023", "1024", "01", "2-1", "0-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		cpus := l.CPUs()
		for i, c := range cpus {
			if c < 0 || c >= MaxCPU || (i > 0 && cpus[i-1] >= c) {
				t.Fatalf("Parse(%q) = %v: not ascending within range", s, cpus)
			}
		}
		back, err := Parse(l.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", l.String(), s, err)
		}
		if !reflect.DeepEqual(back.CPUs(), cpus) || back.String() != l.String() {
			t.Fatalf("%q -> %q -> %v, want %v", s, l.String(), back.CPUs(), cpus)
		}
	})
}
