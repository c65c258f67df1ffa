package qemu

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// The guest's serial console is a file QEMU appends to (chardev file,
// append=on): a guest can write to its serial port without end, so the
// file is capped. When it grows past maxConsole, its last keepConsole
// bytes become <console>.1 and the file is truncated; QEMU, appending,
// carries on at the new end. At most maxConsole + keepConsole bytes stay.
// QEMU's own output, qemu.log (opened for appending by openVMMLog, so a
// truncation leaves no hole before QEMU's next write), is capped the same
// way at maxVMMLog: a guest can make QEMU warn without end (a device's
// guest errors), and the file outlives the node server's restarts.
const (
	maxConsole   = 4 << 20
	keepConsole  = 256 << 10
	maxVMMLog    = 1 << 20
	consoleCheck = 2 * time.Second
)

// openVMMLog opens (emptied) the file QEMU's stdout and stderr go to.
// O_APPEND: every write lands at the current end, so when the cap
// truncates the file QEMU carries on at offset zero.
func openVMMLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("qemu log %s: %w", path, err)
	}
	return f, nil
}

// cappedFile is a file the machine's cap rotates past limit bytes.
type cappedFile struct {
	path  string
	limit int64
}

// cappedFiles are the machine's files a guest can grow: its console and
// QEMU's log.
func (m *machine) cappedFiles() []cappedFile {
	return []cappedFile{{m.rd.console, maxConsole}, {m.rd.path("qemu.log"), maxVMMLog}}
}

// startConsoleCap starts capping the machine's console and QEMU's log
// until the VMM ends or stopConsoleCap.
func (m *machine) startConsoleCap() {
	m.consoleStop, m.consoleDone = make(chan struct{}), make(chan struct{})
	files := m.cappedFiles()
	go func() {
		defer close(m.consoleDone)
		capFiles(files, consoleCheck, m.exited, m.consoleStop)
	}()
}

// stopConsoleCap ends the console cap and waits for it (idempotent).
func (m *machine) stopConsoleCap() {
	if m.consoleStop == nil {
		return
	}
	select {
	case <-m.consoleStop:
	default:
		close(m.consoleStop)
	}
	<-m.consoleDone
}

// capConsole rotates the console file every interval until exited or stop
// is closed.
func capConsole(path string, limit int64, every time.Duration, exited, stop <-chan struct{}) {
	capFiles([]cappedFile{{path, limit}}, every, exited, stop)
}

// capFiles rotates each file past its limit every interval until exited
// or stop is closed.
func capFiles(files []cappedFile, every time.Duration, exited, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-exited:
			return
		case <-stop:
			return
		case <-t.C:
			for _, f := range files {
				_ = rotateConsole(f.path, f.limit)
			}
		}
	}
}

// rotateConsole keeps the tail of an over-long console in path.1 and
// empties path.
func rotateConsole(path string, limit int64) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() <= limit {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tail, err := readTail(f, st.Size())
	if err != nil {
		return fmt.Errorf("rotate console %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path+".1", tail, 0o600); err != nil {
		return fmt.Errorf("rotate console %s: %w", path, err)
	}
	// What the guest wrote while the tail was saved (a synced write takes
	// a while, longer on a loaded host) is saved too, again until a pass
	// finds nothing new; what it writes between the last check and the
	// truncation, a few microseconds, is lost: a console, not a record.
	for size, pass := st.Size(), 0; pass < 8; pass++ {
		st2, err := f.Stat()
		if err != nil || st2.Size() <= size {
			break
		}
		size = st2.Size()
		if tail, err = readTail(f, size); err == nil {
			err = atomicfile.WriteFile(path+".1", tail, 0o600)
		}
		if err != nil {
			return fmt.Errorf("rotate console %s: %w", path, err)
		}
	}
	return os.Truncate(path, 0)
}

// readTail reads the last keepConsole bytes of f's first size bytes.
func readTail(f *os.File, size int64) ([]byte, error) {
	keep := min(int64(keepConsole), size)
	tail := make([]byte, keep)
	if _, err := f.ReadAt(tail, size-keep); err != nil && err != io.EOF {
		return nil, err
	}
	return tail, nil
}
