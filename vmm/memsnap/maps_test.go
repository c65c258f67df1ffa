package memsnap

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseMapsLine(t *testing.T) {
	t.Parallel()
	good := []struct {
		line string
		want Mapping
	}{
		{"7f0000000000-7f0004000000 rw-p 00000000 fe:01 1234                       /var/lib/aenv/mem file",
			Mapping{Start: 0x7f0000000000, End: 0x7f0004000000, Perms: "rw-p", DevMajor: 0xfe, DevMinor: 1, Inode: 1234, Path: "/var/lib/aenv/mem file"}},
		{"00400000-00452000 r-xs 00001000 08:10 173521 /usr/bin/x (deleted)\n",
			Mapping{Start: 0x400000, End: 0x452000, Perms: "r-xs", Offset: 0x1000, DevMajor: 8, DevMinor: 0x10, Inode: 173521, Path: "/usr/bin/x (deleted)"}},
		{"7ffd1000-7ffd2000 r--p 00000000 00:00 0 ", Mapping{Start: 0x7ffd1000, End: 0x7ffd2000, Perms: "r--p"}},
		{"7ffd1000-7ffd2000 ---p 00000000 00:00 0", Mapping{Start: 0x7ffd1000, End: 0x7ffd2000, Perms: "---p"}},
		{"01c0e000-01c2f000 rw-p 00000000 00:00 0                                  [heap]",
			Mapping{Start: 0x1c0e000, End: 0x1c2f000, Perms: "rw-p", Path: "[heap]"}},
		{"1000-1000 rw-p 0 103:ffff 1 /x", Mapping{Start: 0x1000, End: 0x1000, Perms: "rw-p", DevMajor: 0x103, DevMinor: 0xffff, Inode: 1, Path: "/x"}},
	}
	for _, tc := range good {
		got, err := ParseMapsLine(tc.line)
		if err != nil {
			t.Errorf("ParseMapsLine(%q): %v", tc.line, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseMapsLine(%q) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
	bad := map[string]string{
		"empty":            "",
		"four fields":      "1000-2000 rw-p 0 08:01",
		"no dash":          "1000 rw-p 0 08:01 1 /x",
		"end before start": "2000-1000 rw-p 0 08:01 1 /x",
		"bad hex start":    "zz-2000 rw-p 0 08:01 1 /x",
		"bad hex end":      "1000-2g00 rw-p 0 08:01 1 /x",
		"overflow":         "1000-1ffffffffffffffff rw-p 0 08:01 1 /x",
		"short perms":      "1000-2000 rw- 0 08:01 1 /x",
		"bad perm letter":  "1000-2000 rw-q 0 08:01 1 /x",
		"bad offset":       "1000-2000 rw-p xyz 08:01 1 /x",
		"dev no colon":     "1000-2000 rw-p 0 0801 1 /x",
		"dev bad minor":    "1000-2000 rw-p 0 08:zz 1 /x",
		"dev huge major":   "1000-2000 rw-p 0 123456789:01 1 /x",
		"hex inode":        "1000-2000 rw-p 0 08:01 ab /x",
		"negative inode":   "1000-2000 rw-p 0 08:01 -1 /x",
		"too long":         "1000-2000 rw-p 0 08:01 1 /" + strings.Repeat("a", maxMapsLine),
	}
	for name, line := range bad {
		if m, err := ParseMapsLine(line); err == nil {
			t.Errorf("%s: ParseMapsLine(%q) = %+v, want an error", name, line, m)
		}
	}
}

func TestFindRegionInMaps(t *testing.T) {
	t.Parallel()
	id := fileID{major: 0xfe, minor: 1, ino: 42, path: "/run/aenv/mem"}
	cases := []struct {
		name    string
		maps    string
		want    Region
		wantErr error
	}{
		{name: "single private mapping",
			maps: "55d0-55e0 r-xp 0 fe:01 7 /bin/qemu\n7f00000-7f40000 rw-p 00000000 fe:01 42 /run/aenv/mem\n",
			want: Region{Start: 0x7f00000, End: 0x7f40000, Path: "/run/aenv/mem"}},
		{name: "largest of several",
			maps: "1000-3000 rw-p 0 fe:01 42 /run/aenv/mem\n10000-20000 rw-p 0 fe:01 42 /run/aenv/mem\n30000-31000 rw-s 0 fe:01 42 /run/aenv/mem\n",
			want: Region{Start: 0x10000, End: 0x20000, Path: "/run/aenv/mem"}},
		{name: "split vmas are merged",
			maps: "10000-14000 rw-p 0 fe:01 42 /run/aenv/mem\n14000-15000 r--p 4000 fe:01 42 /run/aenv/mem\n15000-20000 rw-p 5000 fe:01 42 /run/aenv/mem\n",
			want: Region{Start: 0x10000, End: 0x20000, Path: "/run/aenv/mem"}},
		{name: "adjacent but not continuous in the file",
			maps: "10000-14000 rw-p 0 fe:01 42 /run/aenv/mem\n14000-1a000 rw-p 0 fe:01 42 /run/aenv/mem\n",
			want: Region{Start: 0x14000, End: 0x1a000, Path: "/run/aenv/mem"}},
		{name: "nonzero file offset",
			maps: "10000-20000 rw-p 2000 fe:01 42 /run/aenv/mem\n",
			want: Region{Start: 0x10000, End: 0x20000, FileOffset: 0x2000, Path: "/run/aenv/mem"}},
		{name: "same inode on another device is another file",
			maps:    "10000-20000 rw-p 0 08:01 42 /other\n",
			wantErr: ErrNotMapped},
		{name: "device differs but inode and path match (btrfs subvolume)",
			maps: "10000-20000 rw-p 0 00:2f 42 /run/aenv/mem\n",
			want: Region{Start: 0x10000, End: 0x20000, Path: "/run/aenv/mem"}},
		{name: "device match preferred over path match",
			maps: "10000-90000 rw-p 0 00:2f 42 /run/aenv/mem\n1000-2000 rw-p 0 fe:01 42 /moved\n",
			want: Region{Start: 0x1000, End: 0x2000, Path: "/moved"}},
		{name: "not mapped", maps: "1000-2000 rw-p 0 fe:01 41 /run/aenv/mem2\n", wantErr: ErrNotMapped},
		{name: "shared", maps: "1000-2000 rw-s 0 fe:01 42 /run/aenv/mem\n", wantErr: ErrSharedMapping},
		{name: "no mappings at all (zombie)", maps: "", wantErr: ErrProcessGone},
		{name: "garbage line", maps: "1000-2000 rw-p 0 fe:01 42 /run/aenv/mem\nnot a maps line\n", wantErr: errAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findRegion(strings.NewReader(tc.maps), id)
			switch {
			case tc.wantErr == errAny && err != nil:
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("findRegion: %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil && err != nil:
				t.Fatalf("findRegion: %v", err)
			case tc.wantErr == nil && got != tc.want:
				t.Fatalf("findRegion = %+v, want %+v", got, tc.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestDisjointRegions(t *testing.T) {
	t.Parallel()
	id := fileID{major: 0xfe, minor: 1, ino: 42, path: "/m"}
	r := func(start, end, off uint64) Region {
		return Region{Start: start, End: end, FileOffset: off, Path: "/m"}
	}
	cases := []struct {
		name string
		maps string
		want []Region
	}{
		{"one", "10000-20000 rw-p 0 fe:01 42 /m\n", []Region{r(0x10000, 0x20000, 0)}},
		{"two regions, reverse address order",
			"10000-20000 rw-p 4000 fe:01 42 /m\n30000-34000 rw-p 0 fe:01 42 /m\n",
			[]Region{r(0x30000, 0x34000, 0), r(0x10000, 0x20000, 0x4000)}},
		{"overlapping in the file: the largest",
			"10000-20000 rw-p 0 fe:01 42 /m\n30000-34000 rw-p 8000 fe:01 42 /m\n",
			[]Region{r(0x10000, 0x20000, 0)}},
		{"a small shared mapping is ignored",
			"10000-20000 rw-p 0 fe:01 42 /m\n30000-31000 rw-s 20000 fe:01 42 /m\n",
			[]Region{r(0x10000, 0x20000, 0)}},
	}
	for _, tc := range cases {
		cands, err := scanMaps(strings.NewReader(tc.maps), id)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		big, err := largest(cands)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := disjointPrivate(cands, big); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func FuzzParseMapsLine(f *testing.F) {
	for _, s := range []string{
		"7f0000000000-7f0004000000 rw-p 00000000 fe:01 1234                       /var/lib/aenv/mem",
		"00400000-00452000 r-xs 00001000 08:10 173521 /usr/bin/x (deleted)",
		"7ffd1000-7ffd2000 r--p 00000000 00:00 0 ",
		"01c0e000-01c2f000 rw-p 00000000 00:00 0    [heap]",
		"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
		"1-0 rw-p 0 0:0 0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		m, err := ParseMapsLine(line)
		if err != nil {
			return
		}
		if m.End < m.Start || !validPerms(m.Perms) {
			t.Fatalf("accepted %q as %+v", line, m)
		}
		_ = m.Shared()
		_ = m.Size()
		// What we accept survives a round trip through the kernel's format.
		again := fmt.Sprintf("%08x-%08x %s %08x %02x:%02x %d %s", m.Start, m.End, m.Perms, m.Offset, m.DevMajor, m.DevMinor, m.Inode, m.Path)
		m2, err := ParseMapsLine(again)
		if err != nil && len(again) <= maxMapsLine {
			t.Fatalf("reformatted %q: %v", again, err)
		}
		if err == nil && !strings.HasSuffix(m.Path, "\n") && m2 != m {
			t.Fatalf("round trip of %q: %+v != %+v", line, m2, m)
		}
	})
}

func FuzzFindRegion(f *testing.F) {
	f.Add("1000-3000 rw-p 0 fe:01 42 /run/aenv/mem\n10000-20000 rw-s 0 fe:01 42 /run/aenv/mem\n")
	f.Add("10000-14000 rw-p 0 fe:01 42 /m\n14000-15000 r--p 4000 00:2f 42 /run/aenv/mem\n")
	f.Fuzz(func(t *testing.T, maps string) {
		id := fileID{major: 0xfe, minor: 1, ino: 42, path: "/run/aenv/mem"}
		r, err := findRegion(strings.NewReader(maps), id)
		if err == nil && (r.End < r.Start || r.Shared) {
			t.Fatalf("findRegion accepted %+v", r)
		}
	})
}
