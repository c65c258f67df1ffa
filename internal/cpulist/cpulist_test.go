package cpulist

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseAccepts(t *testing.T) {
	for in, want := range map[string]struct {
		cpus []int
		str  string
	}{
		"":          {nil, ""},
		"0":         {[]int{0}, "0"},
		"0-1,3":     {[]int{0, 1, 3}, "0-1,3"},
		"3,0-1":     {[]int{0, 1, 3}, "0-1,3"},
		"5-5":       {[]int{5}, "5"},
		"1,2,3,7":   {[]int{1, 2, 3, 7}, "1-3,7"},
		"1023":      {[]int{1023}, "1023"},
		"10-12,100": {[]int{10, 11, 12, 100}, "10-12,100"},
	} {
		l, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if !reflect.DeepEqual(l.CPUs(), want.cpus) || l.String() != want.str {
			t.Errorf("Parse(%q) = %v %q, want %v %q", in, l.CPUs(), l.String(), want.cpus, want.str)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for in, part := range map[string]string{
		",":        `part ""`,
		"0,":       `part ""`,
		"0,,1":     `part ""`,
		" 0":       `part " 0"`,
		"0 ":       `part "0 "`,
		"+1":       `part "+1"`,
		"-1":       `part "-1"`,
		"1-":       `part "1-"`,
		"1-2-3":    `part "1-2-3"`,
		"3-1":      `part "3-1"`,
		"01":       `part "01"`,
		"1024":     `part "1024"`,
		"99999999": `part "99999999"`,
		"0-1,1":    `part "1"`,
		"0-3,2-5":  `part "2-5"`,
		"a":        `part "a"`,
		"0x1":      `part "0x1"`,
		"１":        `part "１"`,
	} {
		_, err := Parse(in)
		if !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %v, want ErrSyntax", in, err)
			continue
		}
		if !strings.Contains(err.Error(), part) {
			t.Errorf("Parse(%q) error %q does not name %s", in, err, part)
		}
	}
}

func TestCheck(t *testing.T) {
	avail, _ := Parse("0-3,6")
	for in, bad := range map[string]string{
		"0-3":     "",
		"6,0":     "",
		"":        "",
		"4":       `part "4": cpu 4`,
		"0-1,5-6": `part "5-6": cpu 5`,
	} {
		l, err := Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		err = l.Check(avail)
		if bad == "" {
			if err != nil {
				t.Errorf("Check(%q): %v", in, err)
			}
			continue
		}
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), bad) {
			t.Errorf("Check(%q) = %v, want ErrUnavailable naming %s", in, err, bad)
		}
	}
}

// TestAvailableAndAffinity reads the real online list and this thread's
// mask, and pins and restores a thread of this process.
func TestAvailableAndAffinity(t *testing.T) {
	avail, err := Available()
	if err != nil {
		t.Fatal(err)
	}
	if avail.Empty() {
		t.Fatal("no available cpu")
	}
	b, err := os.ReadFile(OnlinePath)
	if err != nil {
		t.Fatal(err)
	}
	online, err := Parse(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := avail.Check(online); err != nil {
		t.Fatalf("available cpus %s are not all online (%s): %v", avail, online, err)
	}
	tid := os.Getpid() // the main thread; runtime threads keep their own masks
	before, err := Affinity(tid)
	if err != nil {
		t.Fatal(err)
	}
	one := FromCPUs(avail.CPUs()[:1])
	if err := SetAffinity(tid, one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = SetAffinity(tid, before) })
	got, err := Affinity(tid)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != one.String() {
		t.Fatalf("affinity after pinning to %s is %s", one, got)
	}
	if err := SetAffinity(tid, List{}); err == nil {
		t.Fatal("pinning to an empty list succeeded")
	}
}
