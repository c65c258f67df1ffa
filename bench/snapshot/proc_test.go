package snapshotbench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/vmmproc"

	"golang.org/x/sys/unix"
)

// vmmPID finds the QEMU process of a sandbox: the one whose command line
// or open files name its run directory (vmmproc).
func vmmPID(id string) (int, error) {
	found := vmmproc.Mentioning(id)
	if len(found) != 1 {
		return 0, fmt.Errorf("sandbox %s: %d VMM processes (%v), want 1", id, len(found), found)
	}
	return found[0], nil
}

// memStats are smaps fields in bytes (a whole process from smaps_rollup,
// or one mapping from smaps).
type memStats struct {
	Size, Rss, Pss, PssAnon, PssFile, PssShmem, SharedClean, PrivateClean, PrivateDirty, Anonymous, AnonHuge int64
}

var memFields = map[string]func(*memStats) *int64{
	"Size":          func(m *memStats) *int64 { return &m.Size },
	"Rss":           func(m *memStats) *int64 { return &m.Rss },
	"Pss":           func(m *memStats) *int64 { return &m.Pss },
	"Pss_Anon":      func(m *memStats) *int64 { return &m.PssAnon },
	"Pss_File":      func(m *memStats) *int64 { return &m.PssFile },
	"Pss_Shmem":     func(m *memStats) *int64 { return &m.PssShmem },
	"Shared_Clean":  func(m *memStats) *int64 { return &m.SharedClean },
	"Private_Clean": func(m *memStats) *int64 { return &m.PrivateClean },
	"Private_Dirty": func(m *memStats) *int64 { return &m.PrivateDirty },
	"Anonymous":     func(m *memStats) *int64 { return &m.Anonymous },
	"AnonHugePages": func(m *memStats) *int64 { return &m.AnonHuge },
}

// addField adds a "Key:   123 kB" line to m; it reports whether the line
// was a field line (a mapping header has spaces before its first colon).
func (m *memStats) addField(line string) bool {
	k, rest, ok := strings.Cut(line, ":")
	if !ok || strings.Contains(k, " ") {
		return false
	}
	f := strings.Fields(rest)
	if len(f) != 2 || f[1] != "kB" {
		return true
	}
	if get := memFields[k]; get != nil {
		if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			*get(m) += v << 10
		}
	}
	return true
}

func rollup(pid int) (memStats, error) {
	var m memStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		m.addField(line)
	}
	return m, nil
}

// mapping is one entry of /proc/<pid>/smaps.
type mapping struct {
	Perms, Path string
	memStats
}

func mappings(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if len(out) > 0 && out[len(out)-1].addField(line) {
			continue
		}
		// A mapping header: "start-end perms offset dev inode [path]".
		fs := strings.Fields(line)
		if len(fs) < 5 {
			return nil, fmt.Errorf("pid %d smaps: unexpected line %q", pid, line)
		}
		m := mapping{Perms: fs[1]}
		if len(fs) >= 6 {
			m.Path = fs[5]
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// guestRAM returns the smaps of pid's guest RAM: the largest mapping of a
// file named memory* (the snapshot's memory image) or of the storage
// daemon's export of it (disk.IsDevice), and the file's path.
func guestRAM(pid int) (memStats, string, error) {
	ms, err := mappings(pid)
	if err != nil {
		return memStats{}, "", err
	}
	var best mapping
	for _, m := range ms {
		if (strings.HasPrefix(filepath.Base(m.Path), "memory") || disk.IsDevice(m.Path)) && m.Size > best.Size {
			best = m
		}
	}
	if best.Path == "" {
		return memStats{}, "", fmt.Errorf("pid %d maps no memory image", pid)
	}
	return best.memStats, best.Path, nil
}

// tcgBuffer returns the smaps of the TCG translation buffer: QEMU's one
// anonymous mapping that is writable and executable (absent under KVM).
func tcgBuffer(ms []mapping) memStats {
	var out memStats
	for _, m := range ms {
		if m.Path == "" && m.Perms == "rwxp" && m.Size > out.Size {
			out = m.memStats
		}
	}
	return out
}

// imageBytes returns the bytes a memory image file allocates on disk and
// how many of them are in non-zero pages (a materialized image leaves zero
// pages as holes, so the two should agree).
func imageBytes(path string) (allocated, nonZero int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, err
	}
	allocated = st.Blocks * 512
	buf := make([]byte, 1<<20)
	zero := make([]byte, 4096)
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		} else if err != nil {
			return 0, 0, fmt.Errorf("seek data %s: %w", path, err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, fmt.Errorf("seek hole %s: %w", path, err)
		}
		for p := data; p < hole; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, 0, err
			}
			if n == 0 {
				break
			}
			for i := 0; i+4096 <= n; i += 4096 {
				if !bytes.Equal(buf[i:i+4096], zero) {
					nonZero += 4096
				}
			}
			p += int64(n)
		}
		off = hole
	}
	return allocated, nonZero, nil
}

// pageCacheBytes returns how much of a file is resident in the host page
// cache (mincore over a read-only shared mapping, which faults nothing in).
func pageCacheBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, fmt.Errorf("mincore %s: %w", path, e)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * 4096, nil
}
