// Package cpulist parses and checks host CPU lists in the kernel's cpulist
// syntax ("0-1,3": single CPUs and inclusive ranges, comma separated), as
// a sandbox's vCPU pinning names them, and sets a thread's CPU affinity to
// one.
//
// Parsing is strict: a list that the kernel would read loosely (spaces,
// signs, overlapping parts, descending ranges) is refused, so what is
// stored is exactly what was meant. Check then compares a parsed list with
// the CPUs this process may use (online and in its own affinity mask).
package cpulist

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxCPU bounds CPU numbers: one past the largest index a list may name.
// It matches the size of unix.CPUSet, the mask sched_setaffinity takes.
const MaxCPU = 1024

// ErrSyntax marks a list that does not parse.
var ErrSyntax = errors.New("cpu list syntax")

// ErrUnavailable marks a list naming a CPU this process cannot use.
var ErrUnavailable = errors.New("cpu not available")

// part is one comma-separated element of a list, kept for error messages.
type part struct {
	text   string
	lo, hi int
}

// List is a parsed CPU list: its CPUs in ascending order, no duplicates.
// The zero List is empty (no pinning).
type List struct {
	cpus  []int
	parts []part
}

// Parse reads s strictly. The empty string is the empty list. A part that
// does not parse, is out of 0..MaxCPU-1, is a descending range or names a
// CPU an earlier part named is an error wrapping ErrSyntax that quotes it.
func Parse(s string) (List, error) {
	var l List
	if s == "" {
		return l, nil
	}
	seen := make(map[int]string)
	for _, text := range strings.Split(s, ",") {
		p, err := parsePart(text)
		if err != nil {
			return List{}, fmt.Errorf("%w: part %q of %q: %s", ErrSyntax, text, s, err)
		}
		for c := p.lo; c <= p.hi; c++ {
			if prev, dup := seen[c]; dup {
				return List{}, fmt.Errorf("%w: part %q of %q: cpu %d is already in part %q", ErrSyntax, text, s, c, prev)
			}
			seen[c] = text
		}
		l.parts = append(l.parts, p)
	}
	for c := range seen {
		l.cpus = append(l.cpus, c)
	}
	sort.Ints(l.cpus)
	return l, nil
}

func parsePart(text string) (part, error) {
	lo, hi, isRange := strings.Cut(text, "-")
	a, err := parseCPU(lo)
	if err != nil {
		return part{}, err
	}
	if !isRange {
		return part{text: text, lo: a, hi: a}, nil
	}
	b, err := parseCPU(hi)
	if err != nil {
		return part{}, err
	}
	if b < a {
		return part{}, fmt.Errorf("range %d-%d descends", a, b)
	}
	return part{text: text, lo: a, hi: b}, nil
}

// parseCPU reads a decimal CPU number: digits only, no sign or space, no
// leading zero but for "0" itself.
func parseCPU(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty cpu number")
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q is not a cpu number", s)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	if len(s) > 4 {
		return 0, fmt.Errorf("cpu %s is out of range 0..%d", s, MaxCPU-1)
	}
	n, _ := strconv.Atoi(s) // at most 4 digits: cannot fail
	if n >= MaxCPU {
		return 0, fmt.Errorf("cpu %d is out of range 0..%d", n, MaxCPU-1)
	}
	return n, nil
}

// FromCPUs is the list of cpus (any order; duplicates are dropped).
func FromCPUs(cpus []int) List {
	l := List{}
	seen := map[int]bool{}
	for _, c := range cpus {
		if c >= 0 && c < MaxCPU && !seen[c] {
			seen[c] = true
			l.cpus = append(l.cpus, c)
		}
	}
	sort.Ints(l.cpus)
	return l
}

// CPUs returns the list's CPUs in ascending order.
func (l List) CPUs() []int { return append([]int(nil), l.cpus...) }

// Empty says whether the list names no CPU.
func (l List) Empty() bool { return len(l.cpus) == 0 }

// Contains says whether cpu is in the list.
func (l List) Contains(cpu int) bool {
	i := sort.SearchInts(l.cpus, cpu)
	return i < len(l.cpus) && l.cpus[i] == cpu
}

// String formats the list canonically: ascending, runs of two or more
// CPUs as ranges ("0-1,3"). Parse(l.String()) has the same CPUs.
func (l List) String() string {
	var b strings.Builder
	for i := 0; i < len(l.cpus); {
		j := i
		for j+1 < len(l.cpus) && l.cpus[j+1] == l.cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(l.cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(l.cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// Check reports the first part of l naming a CPU that is not in avail, as
// an error wrapping ErrUnavailable.
func (l List) Check(avail List) error {
	for _, p := range l.parts {
		for c := p.lo; c <= p.hi; c++ {
			if !avail.Contains(c) {
				return fmt.Errorf("%w: part %q: cpu %d is not available on this node (available: %s)", ErrUnavailable, p.text, c, avail)
			}
		}
	}
	return nil
}

// OnlinePath is where the kernel lists the online CPUs.
const OnlinePath = "/sys/devices/system/cpu/online"

// Available is the CPUs this process may run on: online ones in its own
// affinity mask (a container's cpuset or taskset narrows it).
func Available() (List, error) {
	b, err := os.ReadFile(OnlinePath)
	if err != nil {
		return List{}, fmt.Errorf("online cpus: %w", err)
	}
	online, err := Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return List{}, fmt.Errorf("online cpus %s: %w", OnlinePath, err)
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return List{}, fmt.Errorf("own cpu affinity: %w", err)
	}
	var cpus []int
	for _, c := range online.cpus {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return FromCPUs(cpus), nil
}

// SetAffinity pins thread tid (of any process; another user's needs
// CAP_SYS_NICE) to the CPUs of l, which must not be empty.
func SetAffinity(tid int, l List) error {
	if l.Empty() {
		return fmt.Errorf("set affinity of thread %d: empty cpu list", tid)
	}
	var set unix.CPUSet
	for _, c := range l.cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(tid, &set); err != nil {
		return fmt.Errorf("set affinity of thread %d to %s: %w", tid, l, err)
	}
	return nil
}

// Affinity returns thread tid's CPU affinity.
func Affinity(tid int) (List, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return List{}, fmt.Errorf("affinity of thread %d: %w", tid, err)
	}
	var cpus []int
	for c := 0; c < MaxCPU; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return FromCPUs(cpus), nil
}
