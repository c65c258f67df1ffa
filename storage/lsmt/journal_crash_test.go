package lsmt

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
)

const crashWriterEnv = "AENV_LSMT_CRASH_WRITER"

// crashBlocks is how many 4 KiB blocks the crash writer cycles over: more
// writes than blocks, so later ones go in place.
const crashBlocks = 64

// TestMain runs the crash writer instead of the tests when the
// environment asks for it (the process TestJournalCrash starts and kills).
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashWriterEnv); dir != "" {
		if err := crashWriter(dir); err != nil {
			fmt.Fprintln(os.Stderr, "crash writer:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// crashWriter writes block i%crashBlocks with the number i (trimmed first,
// three times in four, so that the write needs a new mapping), flushes
// every 5th write, and prints "ACK i" once write i is answered, until it
// is killed.
func crashWriter(dir string) error {
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), crashBlocks*4096, UUID{})
	if err != nil {
		return err
	}
	b := make([]byte, 4096)
	for i := 1; ; i++ {
		binary.LittleEndian.PutUint64(b, uint64(i))
		if i%4 != 0 {
			if err := u.Trim(int64(i%crashBlocks)*4096, 4096); err != nil {
				return err
			}
		}
		if _, err := u.WriteAt(b, int64(i%crashBlocks)*4096); err != nil {
			return err
		}
		if i%5 == 0 {
			if err := u.Flush(); err != nil {
				return err
			}
		}
		fmt.Printf("ACK %d\n", i)
	}
}

// TestJournalCrash kills a process writing to an upper (SIGKILL: at a
// fault point between a flush's durable batch and the journal's rotation,
// or from outside after some hundred answered writes) and checks that
// every block reads the last write answered to it, or the one in flight.
func TestJournalCrash(t *testing.T) {
	for _, point := range []string{"lsmt/flush/indexed=crash@20", "lsmt/flush/indexed=crash@41", ""} {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), crashWriterEnv+"="+dir, failpoint.EnvVar+"="+point)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			acked := 0
			for sc := bufio.NewScanner(out); sc.Scan(); {
				if n, ok := strings.CutPrefix(sc.Text(), "ACK "); ok {
					acked, _ = strconv.Atoi(n)
				}
				if point == "" && acked == 303 { // three answered writes after the last flush
					cmd.Process.Kill()
				}
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the writer did not die by SIGKILL: %v", err)
			}
			checkCrashBlocks(t, dir, acked)
		})
	}
}

// checkCrashBlocks: block k holds the last answered write to it, or the
// write after acked when that one is to k (it was in flight, maybe only
// its trim done).
func checkCrashBlocks(t *testing.T, dir string, acked int) {
	t.Helper()
	if acked < crashBlocks {
		t.Fatalf("only %d writes answered before the crash, want more than %d", acked, crashBlocks)
	}
	u, err := OpenUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	got := readUpper(t, u)
	for k := range crashBlocks {
		want := uint64(acked - (acked-k+crashBlocks)%crashBlocks) // the last i <= acked with i%crashBlocks == k
		v := binary.LittleEndian.Uint64(got[k*4096:])
		inFlight := (acked+1)%crashBlocks == k && (v == uint64(acked+1) || v == 0)
		if v != want && !inFlight {
			t.Errorf("block %d reads write %d, want %d (%d writes answered)", k, v, want, acked)
		}
	}
}
