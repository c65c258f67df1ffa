package nodeagent

import (
	"slices"
	"strings"
	"testing"
)

func TestParseCPUInfo(t *testing.T) {
	in := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n" +
		"cpu MHz\t\t: 2899.998\nflags\t\t: fpu vme sse4_2 avx2\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
	p, err := parseCPUInfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUModel != "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz" || p.TSCkHz != 2899998 ||
		!slices.Equal(p.CPUFlags, []string{"fpu", "vme", "sse4_2", "avx2"}) {
		t.Fatalf("parsed %+v", p)
	}
}

// The host's own /proc/cpuinfo names a model (every Linux host running
// the node has one).
func TestHostCPU(t *testing.T) {
	p, err := HostCPU()
	if err != nil {
		t.Fatalf("read /proc/cpuinfo: %v", err)
	}
	if p.CPUModel == "" || len(p.CPUFlags) == 0 {
		t.Fatalf("host CPU without model or flags: %+v", p)
	}
}
