package orchestrator

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/store"
)

type ent struct {
	name, body, link string
	typ              byte
	mode             int64
}

func mkTar(t testing.TB, ents []ent, compress bool) []byte {
	t.Helper()
	var b bytes.Buffer
	var w io.Writer = &b
	var gz *gzip.Writer
	if compress {
		gz = gzip.NewWriter(&b)
		w = gz
	}
	tw := tar.NewWriter(w)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, Size: int64(len(e.body))}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	if gz != nil {
		gz.Close()
	}
	return b.Bytes()
}

// readTar lists name -> "type mode uid:gid body|link" of an archive.
func readTar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		v := fmt.Sprintf("%c %o %d:%d %s%s", h.Typeflag, h.Mode, h.Uid, h.Gid, body, h.Linkname)
		out[h.Name] = v
	}
}

func opener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

func TestCopyArchive(t *testing.T) {
	t.Parallel()
	ctx := []ent{
		{name: "src/", typ: tar.TypeDir, mode: 0o755},
		{name: "src/a.txt", body: "A"},
		{name: "src/sub/", typ: tar.TypeDir, mode: 0o750},
		{name: "src/sub/b.sh", body: "B", mode: 0o755},
		{name: "src/link", typ: tar.TypeSymlink, link: "a.txt"},
		{name: "src/hard", typ: tar.TypeLink, link: "src/a.txt"},
		{name: "conf.txt", body: "C"},
		{name: "./other.txt", body: "O"},
	}
	cases := []struct {
		name string
		plan copyPlan
		want map[string]string
	}{
		{"directory contents into dest", copyPlan{src: "src", dest: "/app", uid: 1000, gid: 1000, mode: -1}, map[string]string{
			"app/": "5 755 1000:1000 ", "app/a.txt": "0 644 1000:1000 A", "app/sub/": "5 750 1000:1000 ",
			"app/sub/b.sh": "0 755 1000:1000 B", "app/link": "2 644 1000:1000 a.txt", "app/hard": "1 644 1000:1000 app/a.txt",
		}},
		{"file to a file path with a mode", copyPlan{src: "conf.txt", dest: "/etc/my.conf", mode: 0o600}, map[string]string{
			"etc/my.conf": "0 600 0:0 C",
		}},
		{"file into a directory", copyPlan{src: "conf.txt", dest: "/etc", destDir: true, mode: -1}, map[string]string{
			"etc/conf.txt": "0 644 0:0 C",
		}},
		{"glob of several files", copyPlan{src: "*.txt", dest: "/x", mode: -1}, map[string]string{
			"x/conf.txt": "0 644 0:0 C", "x/other.txt": "0 644 0:0 O",
		}},
	}
	for _, gz := range []bool{false, true} {
		arch := mkTar(t, ctx, gz)
		for _, c := range cases {
			var out bytes.Buffer
			n, err := copyArchive(opener(arch), c.plan, &out)
			if err != nil {
				t.Fatalf("%s (gzip %v): %v", c.name, gz, err)
			}
			got := readTar(t, out.Bytes())
			if n != len(got) || !reflect.DeepEqual(got, c.want) {
				keys := make([]string, 0, len(got))
				for k, v := range got {
					keys = append(keys, k+" = "+v)
				}
				sort.Strings(keys)
				t.Errorf("%s (gzip %v): %d entries\n%s", c.name, gz, n, strings.Join(keys, "\n"))
			}
		}
	}
}

func TestCopyArchiveRejects(t *testing.T) {
	t.Parallel()
	cases := map[string][]ent{
		"dot-dot":        {{name: "../evil", body: "x"}},
		"nested dot-dot": {{name: "a/../../evil", body: "x"}},
		"absolute":       {{name: "/etc/passwd", body: "x"}},
	}
	for name, ents := range cases {
		var out bytes.Buffer
		if _, err := copyArchive(opener(mkTar(t, ents, false)), copyPlan{src: "", dest: "/app", mode: -1}, &out); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	var out bytes.Buffer
	_, err := copyArchive(opener(mkTar(t, []ent{{name: "a.txt", body: "x"}}, false)), copyPlan{src: "b.txt", dest: "/app", mode: -1}, &out)
	if err == nil || !strings.Contains(err.Error(), "no file in the uploaded archive matches") {
		t.Errorf("no match: %v", err)
	}
	_, err = copyArchive(opener(mkTar(t, []ent{{name: "a/x", typ: tar.TypeLink, link: "b/y"}}, false)), copyPlan{src: "a", dest: "/app", mode: -1}, &out)
	if err == nil {
		t.Error("hard link out of the copied files accepted")
	}
	if _, err := copyArchive(opener([]byte("not a tar at all, just some bytes that go on and on")), copyPlan{dest: "/"}, &out); err == nil {
		t.Error("garbage accepted")
	}
}

func TestValidateSteps(t *testing.T) {
	t.Parallel()
	hash := strings.Repeat("ab", 32)
	good := []BuildStep{{Type: "RUN", Args: []string{"true"}}, {Type: "env", Args: []string{"A", "1"}},
		{Type: "COPY", Args: []string{"a", "/b"}, FilesHash: hash}, {Type: "USER", Args: []string{"root"}}}
	if err := validateSteps(good); err != nil {
		t.Fatal(err)
	}
	bad := [][]BuildStep{
		{{Type: "HEALTHCHECK", Args: []string{"x"}}},
		{{Type: "RUN"}},
		{{Type: "ENV", Args: []string{"A"}}},
		{{Type: "COPY", Args: []string{"a", "/b"}, FilesHash: "nothex"}},
		{{Type: "COPY", Args: []string{"a", "/b"}, FilesHash: strings.ToUpper(hash)}},
	}
	for _, b := range bad {
		if err := validateSteps(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", b, err)
		}
	}
}

// FuzzCopyArchive: an uploaded archive (untrusted) never panics the
// rewrite, and nothing it writes escapes the destination.
func FuzzCopyArchive(f *testing.F) {
	f.Add(mkTar(f, []ent{{name: "src/a", body: "A"}, {name: "src/l", typ: tar.TypeSymlink, link: "/etc"}}, false), "src", "/app/")
	f.Add(mkTar(f, []ent{{name: "x", body: "A"}}, true), "*", "/")
	f.Add([]byte{0x1f, 0x8b, 0, 1, 2}, "", "/d")
	f.Fuzz(func(t *testing.T, arch []byte, src, dest string) {
		s, err := cleanRel(src)
		if err != nil {
			return
		}
		plan := copyPlan{src: s, dest: path.Clean("/" + dest), destDir: strings.HasSuffix(dest, "/"), mode: -1}
		var out bytes.Buffer
		if _, err := copyArchive(opener(arch), plan, &out); err != nil {
			return
		}
		tr := tar.NewReader(&out)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			name := path.Clean("/" + h.Name)
			if name == "/" || h.Name == "" || name != plan.dest && !strings.HasPrefix(name, strings.TrimSuffix(plan.dest, "/")+"/") {
				t.Fatalf("entry %q outside %q (or the root itself)", h.Name, plan.dest)
			}
			if l := h.Linkname; h.Typeflag == tar.TypeLink && !strings.HasPrefix(path.Clean("/"+l), strings.TrimSuffix(plan.dest, "/")+"/") && path.Clean("/"+l) != plan.dest {
				t.Fatalf("hard link %q -> %q outside %q", h.Name, l, plan.dest)
			}
		}
	})
}

// TestBuildStateSurvivesRestart: without VMs, the build bookkeeping of a
// node: create (and re-create by name), uploads checked by SHA-256, a build
// a restart interrupted marked failed with its reason and log, deletion.
func TestBuildStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	start := func() *Orchestrator {
		o, err := New(ctx, Options{DataDir: dir, Store: st, VCPUs: 1, MemoryMiB: 256})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.EnableBuilds(ctx, ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.CloseBuilds)
		return o
	}
	o := start()
	tpl, b1, err := o.CreateTemplate(TemplateRequest{Name: "py", Tags: []string{"v1"}})
	if err != nil || tpl.Status != BuildWaiting || tpl.VCPUs != 1 || tpl.MemoryMiB != 256 {
		t.Fatalf("create: %+v %v", tpl, err)
	}
	again, b2, err := o.CreateTemplate(TemplateRequest{Name: "py", VCPUs: 2, MemoryMiB: 512})
	if err != nil || again.ID != tpl.ID || b2 == b1 || again.VCPUs != 2 {
		t.Fatalf("re-create by name: %+v %s %v", again, b2, err)
	}
	for _, bad := range []TemplateRequest{{Name: "../x"}, {Name: "ok", MemoryMiB: 64}, {Name: "ok", VCPUs: 1000}} {
		if _, _, err := o.CreateTemplate(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("create %+v: %v", bad, err)
		}
	}
	if err := o.StartBuild(tpl.ID, b1, BuildSpec{FromImage: "x:1"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("build without the storage daemon: %v", err)
	}

	data := []byte("archive bytes")
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if ok, err := o.TemplateFilesPresent(tpl.ID, hash); ok || err != nil {
		t.Fatalf("present before upload: %v %v", ok, err)
	}
	if err := o.PutTemplateFiles(ctx, tpl.ID, hash, bytes.NewReader([]byte("other bytes"))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("mismatching upload: %v", err)
	}
	if err := o.PutTemplateFiles(ctx, "nosuch", hash, bytes.NewReader(data)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("upload for an unknown template: %v", err)
	}
	if err := o.PutTemplateFiles(ctx, "py", hash, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.TemplateFilesPresent(tpl.ID, hash); !ok || err != nil {
		t.Fatalf("present after upload: %v %v", ok, err)
	}

	// A restart while b2 was building (as the worker records it).
	b, _ := o.builder()
	b.mu.Lock()
	rec := b.recs[tpl.ID].clone()
	rec.Builds[b2].Status, rec.Status = BuildBuilding, BuildBuilding
	b.mu.Unlock()
	if err := st.Put(store.Templates, tpl.ID, rec); err != nil {
		t.Fatal(err)
	}
	// And a template with a ready snapshot whose rebuild was interrupted.
	ready, rb, err := o.CreateTemplate(TemplateRequest{Name: "served"})
	if err != nil {
		t.Fatal(err)
	}
	ready.Snapshot, ready.BuildID, ready.Status = t.TempDir(), "earlier", BuildReady
	ready.Builds[rb].Status = BuildBuilding
	if err := st.Put(store.Templates, ready.ID, ready); err != nil {
		t.Fatal(err)
	}
	b.log(tpl.ID, b2, "info", "1", "step output before the crash")
	o.CloseBuilds()
	if _, _, err := o.CreateTemplate(TemplateRequest{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create after CloseBuilds: %v", err)
	}

	o = start()
	bs, err := o.BuildStatusOf("py", b2, 0, 100, "")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("status by name (ids only): %v", err)
	}
	bs, err = o.BuildStatusOf(tpl.ID, b2, 0, 100, "")
	if err != nil || bs.Status != BuildError || bs.Reason != "interrupted by node restart" || len(bs.Logs) != 2 ||
		bs.Logs[0].Message != "step output before the crash" || bs.Logs[1].Level != "error" {
		t.Fatalf("after restart: %+v %v", bs, err)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 0, 100, "error"); len(bs.Logs) != 1 {
		t.Fatalf("level filter: %+v", bs.Logs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 1, 100, ""); len(bs.Logs) != 1 || bs.Logs[0].Level != "error" {
		t.Fatalf("offset: %+v", bs.Logs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b2, 0, 0, ""); len(bs.Logs) != 0 || bs.Status != BuildError {
		t.Fatalf("limit 0: %+v", bs)
	}
	if bs, _ := o.BuildStatusOf(tpl.ID, b1, 0, 100, ""); bs.Status != BuildWaiting {
		t.Fatalf("the waiting build: %+v", bs)
	}
	if got, err := o.ResolveTemplate("py"); err != nil || got.ID != tpl.ID || got.Status != BuildError {
		t.Fatalf("resolve by name: %+v %v", got, err)
	}
	if _, err := o.Template("py"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unbuilt template serves sandboxes: %v", err)
	}
	if got, err := o.Template("served"); err != nil || got.ID != ready.ID {
		t.Fatalf("a served template whose rebuild was interrupted: %+v %v", got, err)
	}
	if bs, _ := o.BuildStatusOf(ready.ID, rb, 0, 100, ""); bs.Status != BuildError {
		t.Fatalf("its interrupted rebuild: %+v", bs)
	}
	if err := o.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.ResolveTemplate(tpl.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := o.DeleteTemplate(ctx, "py"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
