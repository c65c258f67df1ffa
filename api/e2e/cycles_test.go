package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestHundredCycles: pause/resume cycles with writes between them lose
// nothing. Each cycle writes a file of random bytes (synced) and one left
// in the page cache; every 20 cycles, and at the end, the guest's page
// cache is dropped and every file's checksum compared with what the guest
// computed when it wrote it. The suite runs the hundred (AENV_E2E_CYCLES
// changes the count for runs by hand); the shared node merges layers above
// maxLayers, so the cycles also cross many background merges.
func TestHundredCycles(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":3600}`)
	cycles := 100
	if v, err := strconv.Atoi(os.Getenv("AENV_E2E_CYCLES")); err == nil && v > 0 {
		cycles = v // shorter or longer runs by hand
	}
	var want []string
	verify := func(at int) {
		t.Helper()
		n.sh(t, id, `sync; echo 3 > /proc/sys/vm/drop_caches`)
		got := n.sh(t, id, `cd /home/user/cycles && sha256sum $(ls | sort -V)`)
		sorted := append([]string(nil), want...)
		sortNatural(sorted)
		if exp := strings.Join(sorted, "\n"); got != exp {
			t.Fatalf("after %d cycles the files read back differently:\n%s\nwant\n%s\n%s", at, got, exp, n.diagnose(id))
		}
		if errs := n.sh(t, id, `dmesg | grep -c 'EXT4-fs error' || true`); errs != "0" {
			t.Fatalf("after %d cycles the guest's ext4 reported %s errors", at, errs)
		}
	}
	n.sh(t, id, `mkdir -p /home/user/cycles`)
	for i := 1; i <= cycles; i++ {
		sums := n.sh(t, id, fmt.Sprintf(`cd /home/user/cycles && head -c 262144 /dev/urandom > s%d && sync s%d && head -c 4096 /dev/urandom > u%d && sha256sum s%d u%d`, i, i, i, i, i))
		want = append(want, strings.Split(sums, "\n")...)
		n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
		n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":3600}`)
		if i%20 == 0 && i < cycles {
			verify(i)
		}
	}
	verify(cycles)
}

// sortNatural orders "sum  s12" lines by file kind, then number, as
// `ls | sort -V` lists the files.
func sortNatural(lines []string) {
	key := func(l string) (byte, int) {
		f := strings.Fields(l)
		name := f[len(f)-1]
		var num int
		fmt.Sscanf(name[1:], "%d", &num)
		return name[0], num
	}
	for i := 1; i < len(lines); i++ {
		for j := i; j > 0; j-- {
			ka, na := key(lines[j-1])
			kb, nb := key(lines[j])
			if ka < kb || ka == kb && na <= nb {
				break
			}
			lines[j-1], lines[j] = lines[j], lines[j-1]
		}
	}
}
