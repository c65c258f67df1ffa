package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
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
		if err := validateSteps(b); !errors.Is(err, errdefs.ErrInvalid) {
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

// FuzzValidateSpec feeds build specs (as the API decodes them) to the
// validation: never a panic, and an accepted spec has only known step
// types with the arguments they need.
func FuzzValidateSpec(f *testing.F) {
	f.Add(`{"fromImage":"a:1","steps":[{"type":"RUN","args":["echo"]}]}`)
	f.Add(`{"fromTemplate":"base","steps":[{"type":"ENV","args":["A","1","B"]}]}`)
	f.Add(`{"steps":[{"type":"copy","args":["a","b"],"filesHash":"` + strings.Repeat("a", 64) + `"}]}`)
	f.Add(`{"steps":[{"type":"HEALTHCHECK"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		var spec BuildSpec
		if json.Unmarshal([]byte(body), &spec) != nil {
			return
		}
		if err := validateSteps(spec.Steps); err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("refusal %v is not ErrInvalid", err)
			}
			return
		}
		for _, st := range spec.Steps {
			typ := strings.ToUpper(st.Type)
			if !slices.Contains(stepTypes, typ) || len(st.Args) == 0 {
				t.Fatalf("accepted step %+v", st)
			}
			if (typ == "COPY" || typ == "ADD") && !validHash(st.FilesHash) {
				t.Fatalf("accepted %s without a valid files hash: %+v", typ, st)
			}
		}
	})
}
