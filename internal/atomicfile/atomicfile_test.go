package atomicfile_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/crashdisk"
)

func TestWriteReplaces(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rec.json")
	for _, s := range []string{"one", "two two"} {
		if err := atomicfile.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if string(got) != s {
			t.Fatalf("read %q, want %q", got, s)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
}

func TestFailedFillLeavesOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec")
	if err := atomicfile.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := atomicfile.Write(p, 0o644, func(w io.Writer) error {
		w.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	got, _ := os.ReadFile(p)
	ents, _ := os.ReadDir(dir)
	if string(got) != "old" || len(ents) != 1 {
		t.Fatalf("after a failed fill: %q, %d entries", got, len(ents))
	}
}

// TestPowerLoss writes records through the helper and, as a control, with a
// plain write+rename, then simulates a power cut: every record written
// through the helper is complete, and the control shows the simulation does
// drop what was not synced (otherwise the test would prove nothing).
func TestPowerLoss(t *testing.T) {
	d := crashdisk.New(t, 64)
	payload := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("record %03d;", i)), 400) }
	for i := range 20 {
		p := filepath.Join(d.Root(), fmt.Sprintf("a-%d", i))
		if err := atomicfile.WriteFile(p, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := atomicfile.WriteFile(p, payload(i), 0o600); err != nil {
			t.Fatal(err)
		}
		// Control: what a careless writer does.
		c := filepath.Join(d.Root(), fmt.Sprintf("c-%d", i))
		if err := os.WriteFile(c+".tmp", payload(i), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(c+".tmp", c); err != nil {
			t.Fatal(err)
		}
	}
	crashed := d.Crash()
	lost := 0
	for i := range 20 {
		got, err := os.ReadFile(filepath.Join(crashed, fmt.Sprintf("a-%d", i)))
		if err != nil || !bytes.Equal(got, payload(i)) {
			t.Fatalf("record a-%d after power loss: %d bytes, %v", i, len(got), err)
		}
		c, err := os.ReadFile(filepath.Join(crashed, fmt.Sprintf("c-%d", i)))
		if err != nil || !bytes.Equal(c, payload(i)) {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("the power-loss simulation kept every unsynced control file: it drops nothing")
	}
	t.Logf("unsynced control files lost or short: %d of 20", lost)
}
