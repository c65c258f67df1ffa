package memsnap

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors a caller may want to tell apart (match with errors.Is).
var (
	// ErrNotMapped: the process has no mapping of the memory file.
	ErrNotMapped = errors.New("memsnap: memory file is not mapped by the process")
	// ErrSharedMapping: the process maps the memory file shared, so its writes
	// went to the file itself and there is no private diff to capture.
	ErrSharedMapping = errors.New("memsnap: memory file is mapped shared, not private")
	// ErrProcessGone: the process does not exist (or has exited and has no memory).
	ErrProcessGone = errors.New("memsnap: process is gone")
)

// Mapping is one line of /proc/<pid>/maps.
type Mapping struct {
	Start, End uint64 // virtual addresses, End exclusive
	Perms      string // e.g. "rw-p"; the last letter is p (private) or s (shared)
	Offset     uint64 // file offset of Start
	DevMajor   uint32
	DevMinor   uint32
	Inode      uint64
	Path       string // may be empty, a pseudo name like [heap], or end in " (deleted)"
}

// Size is the mapping's length in bytes.
func (m Mapping) Size() uint64 { return m.End - m.Start }

// Shared reports whether the mapping is MAP_SHARED.
func (m Mapping) Shared() bool { return m.Perms[3] == 's' }

// maxMapsLine bounds a line we accept; the kernel's lines are far shorter
// than this even with a PATH_MAX path.
const maxMapsLine = 16 << 10

// ParseMapsLine parses one line of /proc/<pid>/maps:
//
//	start-end perms offset major:minor inode   [path]
//
// Numbers are hex except the decimal inode. The path is everything after the
// inode and its padding (it may contain spaces). Bad input gives an error.
func ParseMapsLine(line string) (Mapping, error) {
	var m Mapping
	if len(line) > maxMapsLine {
		return m, fmt.Errorf("maps line of %d bytes is too long", len(line))
	}
	line = strings.TrimSuffix(line, "\n")
	rest := line
	var fields [5]string
	for i := range fields {
		rest = strings.TrimLeft(rest, " ")
		end := strings.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		fields[i], rest = rest[:end], rest[end:]
		if fields[i] == "" {
			return m, fmt.Errorf("maps line %q: %d fields, need at least 5", line, i)
		}
	}
	m.Path = strings.TrimLeft(rest, " ")
	var err error
	if m.Start, m.End, err = parseRange(fields[0]); err != nil {
		return m, fmt.Errorf("maps line %q: %w", line, err)
	}
	if !validPerms(fields[1]) {
		return m, fmt.Errorf("maps line %q: bad permissions %q", line, fields[1])
	}
	m.Perms = fields[1]
	if m.Offset, err = strconv.ParseUint(fields[2], 16, 64); err != nil {
		return m, fmt.Errorf("maps line %q: offset: %w", line, err)
	}
	if m.DevMajor, m.DevMinor, err = parseDev(fields[3]); err != nil {
		return m, fmt.Errorf("maps line %q: %w", line, err)
	}
	if m.Inode, err = strconv.ParseUint(fields[4], 10, 64); err != nil {
		return m, fmt.Errorf("maps line %q: inode: %w", line, err)
	}
	return m, nil
}

func parseRange(s string) (uint64, uint64, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("address range %q has no '-'", s)
	}
	start, err := strconv.ParseUint(a, 16, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("range start: %w", err)
	}
	end, err := strconv.ParseUint(b, 16, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("range end: %w", err)
	}
	if end < start {
		return 0, 0, fmt.Errorf("address range %q ends before it starts", s)
	}
	return start, end, nil
}

func validPerms(p string) bool {
	return len(p) == 4 && (p[0] == 'r' || p[0] == '-') && (p[1] == 'w' || p[1] == '-') &&
		(p[2] == 'x' || p[2] == '-') && (p[3] == 'p' || p[3] == 's')
}

func parseDev(s string) (uint32, uint32, error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("device %q is not major:minor", s)
	}
	maj, err := strconv.ParseUint(a, 16, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("device major: %w", err)
	}
	minor, err := strconv.ParseUint(b, 16, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("device minor: %w", err)
	}
	return uint32(maj), uint32(minor), nil
}

// Region is a process's mapping of a memory file: one VMA, or several
// adjacent VMAs that continue each other in the file (an mprotect or madvise
// of part of a mapping splits it; the pages are still one mapping).
type Region struct {
	Start, End uint64 // virtual addresses, End exclusive
	FileOffset uint64 // file offset of Start
	Shared     bool
	Path       string
}

// Size is the region's length in bytes.
func (r Region) Size() uint64 { return r.End - r.Start }

// fileID identifies the memory file as the kernel prints it in maps.
type fileID struct {
	major, minor uint32
	ino          uint64
	path         string // absolute, symlinks resolved
}

func statFileID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	id := fileID{major: unix.Major(st.Dev), minor: unix.Minor(st.Dev), ino: st.Ino}
	if p, err := filepath.EvalSymlinks(path); err == nil {
		if p, err = filepath.Abs(p); err == nil {
			id.path = p
		}
	}
	return id, nil
}

// FindRegion finds the mapping of memFile in process pid: the VMAs whose
// device and inode are memFile's (when none do, the ones with memFile's inode
// and path, for filesystems whose stat device differs from the one maps shows,
// such as btrfs subvolumes), adjacent ones merged, the largest kept. It fails
// with ErrNotMapped when there is none and ErrSharedMapping when the largest
// is shared.
func FindRegion(pid int, memFile string) (Region, error) {
	cands, err := findCandidates(pid, memFile)
	if err != nil {
		return Region{}, err
	}
	r, err := largest(cands)
	if err != nil {
		return r, fmt.Errorf("find mapping of %s in pid %d: %w", memFile, pid, err)
	}
	return r, nil
}

// FindRegions is FindRegion for a VMM that maps guest RAM as several regions
// of one file (Firecracker maps each guest memory region of its memory file
// separately, e.g. below and above the 32-bit MMIO gap of a guest of more
// than 3 GiB). It returns every private mapping of memFile, in file order,
// when they cover disjoint parts of the file; otherwise (two mappings of the
// same pages, which a guest cannot both be using) only the largest, as
// FindRegion does. Shared mappings other than the largest are ignored.
func FindRegions(pid int, memFile string) ([]Region, error) {
	cands, err := findCandidates(pid, memFile)
	if err != nil {
		return nil, err
	}
	big, err := largest(cands)
	if err != nil {
		return nil, fmt.Errorf("find mappings of %s in pid %d: %w", memFile, pid, err)
	}
	return disjointPrivate(cands, big), nil
}

func findCandidates(pid int, memFile string) ([]Region, error) {
	id, err := statFileID(memFile)
	if err != nil {
		return nil, fmt.Errorf("find mapping of %s: %w", memFile, err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("find mapping of %s in pid %d: %w", memFile, pid, ErrProcessGone)
		}
		return nil, fmt.Errorf("find mapping of %s in pid %d: %w", memFile, pid, err)
	}
	defer f.Close()
	cands, err := scanMaps(f, id)
	if err != nil {
		return nil, fmt.Errorf("find mapping of %s in pid %d: %w", memFile, pid, err)
	}
	return cands, nil
}

// findRegion scans maps text for the largest mapping of id.
func findRegion(maps io.Reader, id fileID) (Region, error) {
	cands, err := scanMaps(maps, id)
	if err != nil {
		return Region{}, err
	}
	return largest(cands)
}

// scanMaps returns the mappings of id in maps text (see FindRegion), never
// an empty list without an error.
func scanMaps(maps io.Reader, id fileID) ([]Region, error) {
	sc := bufio.NewScanner(maps)
	sc.Buffer(make([]byte, 0, 4096), maxMapsLine)
	var byDev, byPath []Region
	lines := 0
	for sc.Scan() {
		lines++
		m, err := ParseMapsLine(sc.Text())
		if err != nil {
			return nil, err
		}
		if m.Inode != id.ino || m.Inode == 0 {
			continue
		}
		switch {
		case m.DevMajor == id.major && m.DevMinor == id.minor:
			byDev = appendRegion(byDev, m)
		case id.path != "" && m.Path == id.path:
			byPath = appendRegion(byPath, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	if lines == 0 {
		// Exited processes (zombies) and kernel threads have no mappings at all.
		return nil, fmt.Errorf("no memory mappings: %w", ErrProcessGone)
	}
	cands := byDev
	if len(cands) == 0 {
		cands = byPath
	}
	if len(cands) == 0 {
		return nil, ErrNotMapped
	}
	return cands, nil
}

// largest picks the largest candidate (the first of equals), which must be private.
func largest(cands []Region) (Region, error) {
	best := cands[0]
	for _, c := range cands[1:] {
		if c.Size() > best.Size() {
			best = c
		}
	}
	if best.Shared {
		return best, fmt.Errorf("%w: [%#x,%#x) is MAP_SHARED", ErrSharedMapping, best.Start, best.End)
	}
	return best, nil
}

// disjointPrivate returns the private candidates in file order if no two
// overlap in the file, else just big.
func disjointPrivate(cands []Region, big Region) []Region {
	var priv []Region
	for _, c := range cands {
		if !c.Shared {
			priv = append(priv, c)
		}
	}
	slices.SortFunc(priv, func(a, b Region) int { return cmp.Compare(a.FileOffset, b.FileOffset) })
	for i := 1; i < len(priv); i++ {
		if priv[i].FileOffset < priv[i-1].FileOffset+priv[i-1].Size() {
			return []Region{big}
		}
	}
	return priv
}

// appendRegion adds m to rs, extending the last region when m continues it in
// both address space and file.
func appendRegion(rs []Region, m Mapping) []Region {
	if n := len(rs); n > 0 {
		last := &rs[n-1]
		if last.End == m.Start && last.FileOffset+last.Size() == m.Offset && last.Shared == m.Shared() {
			last.End = m.End
			return rs
		}
	}
	return append(rs, Region{Start: m.Start, End: m.End, FileOffset: m.Offset, Shared: m.Shared(), Path: m.Path})
}
