package vmmtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CaptureMemory writes the guest RAM that the VMM process pid sees through
// its mapping(s) of memFile into a new file dst of memFile's size, leaving
// zero pages as holes. The VM must be paused. This is the simple test-side
// capture (it reads every page through /proc/<pid>/mem); production code
// reads only the pages the VM wrote (vmm/memsnap).
func CaptureMemory(pid int, memFile, dst string) (written int64, err error) {
	st, err := os.Stat(memFile)
	if err != nil {
		return 0, fmt.Errorf("capture memory: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("capture memory: no inode for %s", memFile)
	}
	maps, err := fileMappings(pid, uint64(sys.Dev), sys.Ino)
	if err != nil {
		return 0, err
	}
	if len(maps) == 0 {
		return 0, fmt.Errorf("capture memory: process %d does not map %s", pid, memFile)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return 0, fmt.Errorf("capture memory: %w", err)
	}
	defer mem.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("capture memory: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if err := out.Truncate(st.Size()); err != nil {
		return 0, fmt.Errorf("capture memory: %w", err)
	}
	buf := make([]byte, 1<<20)
	for _, m := range maps {
		for addr := m.start; addr < m.end; {
			n := min(uint64(len(buf)), m.end-addr)
			if _, err := mem.ReadAt(buf[:n], int64(addr)); err != nil && err != io.EOF {
				return written, fmt.Errorf("capture memory: read %#x: %w", addr, err)
			}
			w, err := writePages(out, buf[:n], int64(m.offset+addr-m.start))
			written += w
			if err != nil {
				return written, fmt.Errorf("capture memory: %w", err)
			}
			addr += n
		}
	}
	return written, nil
}

type mapping struct{ start, end, offset uint64 }

// fileMappings lists the address ranges of pid that map the file (dev, ino).
func fileMappings(pid int, dev, ino uint64) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("capture memory: %w", err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset major:minor inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		if i, _ := strconv.ParseUint(fields[4], 10, 64); i != ino {
			continue
		}
		majMin := strings.SplitN(fields[3], ":", 2)
		maj, _ := strconv.ParseUint(majMin[0], 16, 32)
		var mnr uint64
		if len(majMin) == 2 {
			mnr, _ = strconv.ParseUint(majMin[1], 16, 32)
		}
		if unix.Mkdev(uint32(maj), uint32(mnr)) != dev {
			continue
		}
		se := strings.SplitN(fields[0], "-", 2)
		start, err1 := strconv.ParseUint(se[0], 16, 64)
		end, err2 := strconv.ParseUint(se[len(se)-1], 16, 64)
		off, err3 := strconv.ParseUint(fields[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || end <= start {
			return nil, fmt.Errorf("capture memory: bad maps line %q", sc.Text())
		}
		out = append(out, mapping{start, end, off})
	}
	return out, sc.Err()
}

// writePages writes the non-zero 4 KiB pages of b, which belongs at off.
func writePages(out *os.File, b []byte, off int64) (int64, error) {
	const page = 4096
	var zero [page]byte
	var written int64
	for p := 0; p < len(b); p += page {
		chunk := b[p:min(p+page, len(b))]
		if bytes.Equal(chunk, zero[:len(chunk)]) {
			continue
		}
		n, err := out.WriteAt(chunk, off+int64(p))
		written += int64(n)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
