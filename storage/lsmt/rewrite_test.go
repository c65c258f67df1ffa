package lsmt

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
)

// churnSmall trims and rewrites a few sectors over and over: the index
// gains entries, the live mappings stay few.
func churnSmall(t *testing.T, m *histModel, st *Stack, r *rand.Rand, rounds int) {
	t.Helper()
	for i := range rounds {
		s := r.Uint64N(32)
		var err error
		if i%2 == 0 {
			err = m.trim(st, s, 1+r.Uint64N(8))
		} else {
			err = m.write(st, s, 1+r.Uint64N(8))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// tempFiles lists what a rewrite left next to the index.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestIndexRewriteFaults: an index rewrite that fails before its rename
// leaves the old index and no temporary file; one that fails after it
// leaves the new index, whose directory the next flush syncs. Either way
// the upper reads on, the next flush succeeds, and a reopened upper reads
// the same. A temporary file a crash left is removed at the next writable
// open.
func TestIndexRewriteFaults(t *testing.T) {
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "d"), filepath.Join(dir, "i")
	u, err := CreateUpper(dp, ip, 1<<20, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	u.rewriteMin = 16
	st := stackOf(t, u)
	m := newHistModel(2048)
	r := rand.New(rand.NewPCG(9, 9))
	for _, point := range []string{"lsmt/index-rewrite/synced", "lsmt/index-rewrite/renamed"} {
		churnSmall(t, m, st, r, 200)
		before, _ := os.Stat(ip)
		if err := failpoint.Arm(point, "error"); err != nil {
			t.Fatal(err)
		}
		err := u.Flush()
		failpoint.Arm(point, "")
		if !errors.Is(err, failpoint.ErrInjected) {
			t.Fatalf("%s: flush answered %v, want the injected error", point, err)
		}
		if tmp := tempFiles(t, dir); len(tmp) > 0 {
			t.Fatalf("%s: the failed rewrite left %v", point, tmp)
		}
		now, _ := os.Stat(ip)
		renamed := point == "lsmt/index-rewrite/renamed"
		if os.SameFile(before, now) == renamed {
			t.Fatalf("%s: the index file was replaced: %v, want %v", point, !os.SameFile(before, now), renamed)
		}
		if u.dirDirty != renamed {
			t.Fatalf("%s: directory sync owed %v, want %v", point, u.dirDirty, renamed)
		}
		if err := m.check(st, false); err != nil {
			t.Fatalf("%s: %v", point, err)
		}
		if err := u.Flush(); err != nil {
			t.Fatalf("%s: the next flush: %v", point, err)
		}
		if u.dirDirty {
			t.Fatalf("%s: the next flush did not sync the directory", point)
		}
		if err := u.checkSpace(); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, ".i.tmp-123")
	if err := os.WriteFile(stale, []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenUpper(dp, ip, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.check(stackOf(t, ro), false); err != nil {
		t.Fatalf("reopened: %v", err)
	}
	ro.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("a read-only open removed a file: %v", err)
	}
	u, err = OpenUpper(dp, ip, false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary index survived a writable open: %v", err)
	}
}
