package memfs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"golang.org/x/sys/unix"
)

// The takeover test runs every server and every reader as a child of the
// test: a server is killed with SIGKILL, and a reader faults on the mount.

const (
	takeSize   = 8 << 20
	takeSeed   = 11
	takeExport = "stack-take"
)

// server is a serving child: it answers "stats" lines on stdin with its
// Stats as JSON and closes its mount when stdin ends.
type server struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	done  chan error
	debug *bytes.Buffer
}

// startServer starts a serving child on dir with its keeper at sock; a
// read that covers blockAt (unless negative) creates mark and never
// returns. It returns once the child serves, and whether it took over.
func startServer(t *testing.T, dir, sock string, blockAt int64, mark string) (*server, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEMFS_CHILD=serve", "MEMFS_DIR="+dir, "MEMFS_SOCK="+sock,
		"MEMFS_BLOCK_AT="+strconv.FormatInt(blockAt, 10), "MEMFS_MARK="+mark)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, in: in, out: bufio.NewReader(outPipe), done: make(chan error, 1), debug: &bytes.Buffer{}}
	cmd.Stderr = s.debug
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); <-s.done })
	line, err := s.out.ReadString('\n')
	go func() { s.done <- cmd.Wait() }()
	if err != nil {
		t.Fatalf("server did not start: %v\n%s", err, s.debug)
	}
	adopted, err := strconv.ParseBool(strings.TrimSpace(strings.TrimPrefix(line, "serving ")))
	if err != nil {
		t.Fatalf("server said %q", line)
	}
	return s, adopted
}

func (s *server) stats(t *testing.T) Stats {
	t.Helper()
	var st Stats
	if _, err := io.WriteString(s.in, "stats\n"); err != nil {
		t.Fatal(err)
	}
	line, err := s.out.ReadString('\n')
	if err == nil {
		err = json.Unmarshal([]byte(line), &st)
	}
	if err != nil {
		t.Fatalf("server stats: %v\n%s", err, s.debug)
	}
	return st
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.done <- nil // for the cleanup
}

// startReader starts a child that maps path MAP_PRIVATE and compares every
// byte with want's (dropping the file's cached pages first with drop).
func startReader(t *testing.T, path, want string, drop bool) (*exec.Cmd, chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEMFS_CHILD=read", "MEMFS_PATH="+path, "MEMFS_WANT="+want,
		"MEMFS_DROP="+strconv.FormatBool(drop))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out.String())
		}
		done <- err
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, done
}

// TestTakeOverAfterKill: a server is killed with SIGKILL while a reader
// maps an export and waits for a read the server had taken; a second
// reader starts while no server runs. The next server takes the connection
// over from the keeper, the read in flight is resent to it, and both
// readers get every byte right (a SIGBUS or a wrong byte fails them). Then
// the keeper is killed while the server lives: the server starts another,
// which carries the connection to a third server.
func TestTakeOverAfterKill(t *testing.T) {
	memfstest.Require(t)
	base := t.TempDir()
	dir, sock, mark := filepath.Join(base, "mem"), filepath.Join(base, "keeper.sock"), filepath.Join(base, "blocked")
	ref := filepath.Join(base, "want")
	if err := os.WriteFile(ref, randomBytes(takeSize, takeSeed), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pid, err := KeeperPID(sock); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	path := filepath.Join(dir, takeExport)

	s1, adopted := startServer(t, dir, sock, 6<<20+4096, mark)
	if adopted {
		t.Fatal("the first server took over a connection")
	}
	_, r1 := startReader(t, path, ref, false)
	waitFile(t, mark, r1)
	s1.kill(t)
	if ok, err := Mounted(dir); err != nil || !ok {
		t.Fatalf("mount gone with its server: %v %v", ok, err)
	}
	_, r2 := startReader(t, path, ref, false) // faults while no server runs

	s2, adopted := startServer(t, dir, sock, -1, "")
	if !adopted {
		t.Fatal("the second server mounted afresh instead of taking over")
	}
	for i, r := range []chan error{r1, r2} {
		if err := <-r; err != nil {
			t.Fatalf("reader %d: %v", i+1, err)
		}
	}
	if st := s2.stats(t); st.Resent == 0 || st.Reads == 0 {
		t.Fatalf("second server stats %+v: want the read in flight at the kill resent to it", st)
	}

	// The keeper dies; the server starts another.
	pid, err := KeeperPID(sock)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for {
		if p, err := KeeperPID(sock); err == nil && p != pid {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s2.kill(t)
	s3, adopted := startServer(t, dir, sock, -1, "")
	if !adopted {
		t.Fatal("the third server mounted afresh instead of taking over from the new keeper")
	}
	_, r3 := startReader(t, path, ref, true)
	if err := <-r3; err != nil {
		t.Fatalf("reader 3: %v", err)
	}
	if st := s3.stats(t); st.Reads == 0 {
		t.Fatalf("third server stats %+v: the reader's dropped pages were not read through it", st)
	}
	s3.in.Close()
	if err := <-s3.done; err != nil {
		t.Fatalf("third server: %v\n%s", err, s3.debug)
	}
	s3.done <- nil
	if ok, _ := Mounted(dir); ok {
		t.Fatal("mount left after the last server closed it")
	}
	if _, err := KeeperPID(sock); err == nil {
		t.Fatal("keeper left after the last server closed the mount")
	}
}

// waitFile waits for path to exist, failing if done reports first.
func waitFile(t *testing.T, path string, done chan error) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("reader ended before the server blocked: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// blockingReader never returns a read that covers at: it creates mark and
// waits forever (a server killed with a read in flight).
type blockingReader struct {
	src  []byte
	at   int64
	mark string
}

func (r *blockingReader) ReadAt(p []byte, off int64) (int, error) {
	if off <= r.at && r.at < off+int64(len(p)) {
		os.WriteFile(r.mark, nil, 0o600)
		for {
			time.Sleep(time.Hour)
		}
	}
	return bytes.NewReader(r.src).ReadAt(p, off)
}

func serveChild() error {
	src := randomBytes(takeSize, takeSeed)
	var r io.ReaderAt = bytes.NewReader(src)
	if at, _ := strconv.ParseInt(os.Getenv("MEMFS_BLOCK_AT"), 10, 64); at >= 0 {
		r = &blockingReader{src: src, at: at, mark: os.Getenv("MEMFS_MARK")}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	s, err := Open(os.Getenv("MEMFS_DIR"), Options{KeeperSocket: os.Getenv("MEMFS_SOCK"), Logger: log})
	if err != nil {
		return err
	}
	if _, err := s.Add(takeExport, r, takeSize); err != nil {
		return err
	}
	if err := s.Serve(); err != nil {
		return err
	}
	fmt.Println("serving", s.Adopted())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		b, _ := json.Marshal(s.Stats())
		fmt.Println(string(b))
	}
	return s.Close()
}

func readChild() error {
	debug.SetGCPercent(-1) // no stop-the-world while a fault waits for a server
	want, err := os.ReadFile(os.Getenv("MEMFS_WANT"))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(os.Getenv("MEMFS_PATH"), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	if os.Getenv("MEMFS_DROP") == "true" {
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return fmt.Errorf("drop cached pages: %w", err)
		}
	}
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	for off := 0; off < len(want); off += 4096 {
		end := min(off+4096, len(want))
		if !bytes.Equal(m[off:end], want[off:end]) {
			return fmt.Errorf("page at %d differs from the source", off)
		}
	}
	return errors.Join(unix.Munmap(m))
}

// TestKeeperAndServerDeadEndsTheMount: with both the server and its
// keeper killed, nothing holds the connection: a read fails (it does not
// hang), and the next server mounts afresh over the dead mount.
func TestKeeperAndServerDeadEndsTheMount(t *testing.T) {
	memfstest.Require(t)
	base := t.TempDir()
	dir, sock := filepath.Join(base, "mem"), filepath.Join(base, "keeper.sock")
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s1, _ := startServer(t, dir, sock, -1, "")
	pid, err := KeeperPID(sock)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	s1.kill(t)
	for { // the keeper is not this process's child: wait for its socket to refuse
		if _, err := KeeperPID(sock); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.ReadFile(filepath.Join(dir, takeExport)); err == nil {
		t.Fatal("a read on a mount nobody holds succeeded")
	}
	s2, adopted := startServer(t, dir, sock, -1, "")
	if adopted {
		t.Fatal("took over a dead connection")
	}
	ref := filepath.Join(base, "want")
	if err := os.WriteFile(ref, randomBytes(takeSize, takeSeed), 0o600); err != nil {
		t.Fatal(err)
	}
	_, r := startReader(t, filepath.Join(dir, takeExport), ref, false)
	if err := <-r; err != nil {
		t.Fatalf("reader on the new mount: %v", err)
	}
	s2.in.Close()
	if err := <-s2.done; err != nil {
		t.Fatalf("server: %v\n%s", err, s2.debug)
	}
	s2.done <- nil
}
