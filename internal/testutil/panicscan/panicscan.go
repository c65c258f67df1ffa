// Package panicscan finds guest kernel crash reports in a console or kernel
// log. The restore tests scan with it (vmm/qemu's restore torture test and
// api/e2e's SDK restore soak), so both count the same lines as a panic.
package panicscan

import (
	"regexp"
	"strings"
)

// crashRE matches the console and kernel log lines that mean the guest
// kernel crashed or found itself corrupt: panics, oopses, BUG reports, the
// faults seen after bad restores, and the stack traces every such report
// (and a WARN) carries.
var crashRE = regexp.MustCompile(`Kernel panic|Oops|Fatal exception|general protection|BUG:|double fault|invalid opcode|stack segment|segfault at|Call Trace`)

// reportLines is how many lines of a report Scan returns: the headline,
// the faulting RIP and the first frames.
const reportLines = 12

// Scan returns the first lines of the first crash report in log, or "".
func Scan(log []byte) string {
	lines := strings.Split(string(log), "\n")
	for i, l := range lines {
		if crashRE.MatchString(l) {
			return strings.Join(lines[i:min(i+reportLines, len(lines))], "\n")
		}
	}
	return ""
}
