package lsmt

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// chain commits n layers the way our writers do (each on the stack of the
// ones below) and returns their bytes, bottom first.
func chain(t *testing.T, n int) [][]byte {
	t.Helper()
	dir := t.TempDir()
	var layers [][]byte
	for i := range n {
		var lowers []*Layer
		for j, b := range layers {
			l, err := OpenSealed(string(rune('a'+j)), bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			lowers = append(lowers, l)
		}
		var parent UUID
		if len(lowers) > 0 {
			parent = lowers[len(lowers)-1].UUID()
		}
		d, x := filepath.Join(dir, string(rune('a'+i))+".data"), filepath.Join(dir, string(rune('a'+i))+".index")
		u, err := CreateUpper(d, x, 1<<20, parent)
		if err != nil {
			t.Fatal(err)
		}
		st, err := NewStack(lowers, u)
		if err != nil {
			t.Fatalf("a stack our writers made does not open: %v", err)
		}
		if _, err := st.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if _, err := st.Commit(context.Background(), &out, "layer"); err != nil {
			t.Fatal(err)
		}
		st.Close()
		layers = append(layers, out.Bytes())
	}
	return layers
}

func openAll(t *testing.T, raws ...[]byte) []*Layer {
	t.Helper()
	var ls []*Layer
	for i, b := range raws {
		l, err := OpenSealed(string(rune('a'+i)), bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	return ls
}

// TestStackChecksParents: a replaced or mis-ordered layer is refused with both
// UUIDs named, unless the caller re-parents on purpose.
func TestStackChecksParents(t *testing.T) {
	t.Parallel()
	c := chain(t, 3)
	other := chain(t, 2) // a different history of the same shape
	if _, err := NewStack(openAll(t, c...), nil); err != nil {
		t.Fatalf("a chain our writers made is refused: %v", err)
	}
	bad := map[string][][]byte{
		"replaced middle": {c[0], other[1], c[2]},
		"swapped":         {c[0], c[2], c[1]},
		"gap":             {c[0], c[2]},
		"foreign base":    {other[0], c[1], c[2]},
		"no parent above": {c[1], c[0]},
	}
	for name, raws := range bad {
		ls := openAll(t, raws...)
		_, err := NewStack(ls, nil)
		if !errors.Is(err, ErrParentMismatch) {
			t.Errorf("%s: NewStack error %v, want a parent mismatch", name, err)
			continue
		}
		found := false
		for i := 1; i < len(ls); i++ {
			if ls[i].ParentUUID() != ls[i-1].UUID() {
				found = strings.Contains(err.Error(), ls[i].ParentUUID().String()) && strings.Contains(err.Error(), ls[i-1].UUID().String())
				break
			}
		}
		if !found {
			t.Errorf("%s: error %q does not name both UUIDs", name, err)
		}
		if _, err := NewStackWith(ls, nil, StackOptions{AllowReparent: true}); err != nil {
			t.Errorf("%s: with AllowReparent: %v", name, err)
		}
	}
	// Merging a chain keeps it a chain: the merged layer takes the bottom's
	// parent, so it stacks on whatever the bottom stacked on.
	var merged bytes.Buffer
	if _, err := Merge(context.Background(), openAll(t, c[1], c[2]), &merged, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStack(openAll(t, c[0], merged.Bytes()), nil); err != nil {
		t.Fatalf("a merge of the top of a chain does not stack on the bottom: %v", err)
	}
}
