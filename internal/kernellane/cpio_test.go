package kernellane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernelpkg"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestCpio writes an archive and reads it back by the newc rules the kernel
// applies: magic, 13 hex fields, name and data each padded to four bytes,
// parents before children, TRAILER!!! last.
func TestCpio(t *testing.T) {
	src := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(src, []byte("hello from a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	err := writeCpio(&buf, []entry{
		{name: "lane/test", mode: typeFile | 0o755, source: src},
		{name: "/lane/config.json", mode: typeFile | 0o644, data: []byte("{}")},
		{name: "bin/sh", mode: typeSymlink | 0o777, symlink: "/lane/test"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var order []string
	b := buf.Bytes()
	for off := 0; ; {
		if len(b)-off < 110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		size, nameLen := field(6), field(11)
		name := string(b[off+110 : off+110+nameLen-1])
		off = align4(off + 110 + nameLen)
		data := string(b[off : off+size])
		off = align4(off + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			break
		}
		got[name], order = data, append(order, name)
	}
	want := map[string]string{"bin": "", "bin/sh": "/lane/test", "lane": "", "lane/config.json": "{}", "lane/test": "hello from a file"}
	if len(got) != len(want) {
		t.Fatalf("members %v, want %v", order, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if order[0] != "bin" || order[1] != "bin/sh" || order[2] != "lane" {
		t.Errorf("order %v: parents must come first", order)
	}
}

func align4(n int) int { return (n + 3) &^ 3 }

// TestResolveModules resolves the lane's modules in the cached kernel, when
// the kernel is there (.ci/setup.d/62-kernel-lane.sh fetches it).
func TestResolveModules(t *testing.T) {
	k, err := kernelpkg.Cached(DefaultCacheDir(), KernelPackage)
	if err != nil {
		testenv.Missing(t, "kernel package not cached: %v", err)
	}
	mods, err := kernelpkg.ResolveModules(k.ModDir, []string{"ublk_drv", "nbd", "loop"})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range mods {
		names[kernelpkg.ModuleName(m)] = true
	}
	for _, want := range []string{"ublk_drv", "nbd", "loop"} {
		if !names[want] {
			t.Errorf("resolved %v: %s missing", mods, want)
		}
	}
	if _, err := kernelpkg.ResolveModules(k.ModDir, []string{"no_such_module"}); err == nil {
		t.Error("an unknown module resolved")
	}
}

// TestPruneInitramfs keeps the most recently used images and drops the
// rest and any unused for a day.
func TestPruneInitramfs(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for i := range 10 {
		p := filepath.Join(dir, fmt.Sprintf("%02d.cpio", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		used := now.Add(-time.Duration(i) * time.Minute)
		if i == 1 {
			used = now.Add(-25 * time.Hour)
		}
		os.Chtimes(p, used, used)
	}
	pruneInitramfs(dir)
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"00.cpio", "02.cpio", "03.cpio", "04.cpio", "05.cpio", "06.cpio", "07.cpio", "08.cpio"}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("left %v, want %v", left, want)
	}
}
