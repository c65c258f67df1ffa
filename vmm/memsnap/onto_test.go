package memsnap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// TestMaterializeOnto: flattening the upper layers onto the materialized
// lower ones gives the same file, holes included, as flattening the whole
// stack.
func TestMaterializeOnto(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, dir := range dirs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			page := func(v byte) []byte { return bytes.Repeat([]byte{v}, int(ps)) }
			type ext struct {
				page int64
				v    byte // 0: zeroed extent
				zero bool // a zero page stored as data
			}
			seal := func(name string, pages int64, exts []ext) string {
				p := filepath.Join(dir, name)
				f, err := os.Create(p)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: uint64(pages * ps)})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range exts {
					switch {
					case e.zero:
						err = xw.WriteData(e.page*ps, page(0))
					case e.v == 0:
						err = xw.WriteZeroed(e.page*ps, ps)
					default:
						err = xw.WriteData(e.page*ps, page(e.v))
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				if _, err := xw.Close(); err != nil {
					t.Fatal(err)
				}
				return p
			}
			var baseExt []ext
			for p := int64(0); p < 16; p++ {
				if p%4 != 3 {
					baseExt = append(baseExt, ext{page: p, v: byte(p + 1)})
				}
			}
			layers := []string{
				seal("l0", 16, baseExt),
				seal("l1", 16, []ext{{page: 1}, {page: 2, v: 0x21}, {page: 3, v: 0x22}, {page: 9, zero: true}}),
				seal("l2", 20, []ext{{page: 1, v: 0x31}, {page: 2}, {page: 4}, {page: 17, v: 0x32}}),
				seal("l3", 12, []ext{{page: 0}, {page: 11, v: 0x41}}),
			}
			for k := 1; k < len(layers); k++ {
				tops := []int{k + 1}
				if k+1 != len(layers) {
					tops = append(tops, len(layers))
				}
				for _, top := range tops {
					t.Run(fmt.Sprintf("%d-onto-%d", top-k, k), func(t *testing.T) {
						lower := filepath.Join(dir, fmt.Sprintf("lower%d-%d", k, top))
						if err := Materialize(ctx, layers[:k], lower); err != nil {
							t.Fatal(err)
						}
						whole := filepath.Join(dir, fmt.Sprintf("whole%d-%d", k, top))
						if err := Materialize(ctx, layers[:top], whole); err != nil {
							t.Fatal(err)
						}
						onto := filepath.Join(dir, fmt.Sprintf("onto%d-%d", k, top))
						if err := MaterializeOnto(ctx, lower, layers[k:top], onto); err != nil {
							t.Fatal(err)
						}
						noTemp(t, onto)
						want, got := readFile(t, whole), readFile(t, onto)
						if !bytes.Equal(got, want) {
							t.Fatalf("onto differs from the whole stack at %s", firstDiff(got, want))
						}
						for p := int64(0); p*ps < int64(len(want)); p++ {
							if h := isHole(t, onto, p); h != isHole(t, whole, p) {
								t.Errorf("page %d: hole=%v in onto, %v in the whole stack", p, h, !h)
							}
						}
						// In place: base and out the same file.
						if err := MaterializeOnto(ctx, lower, layers[k:top], lower); err != nil {
							t.Fatal(err)
						}
						if got := readFile(t, lower); !bytes.Equal(got, want) {
							t.Fatalf("in place differs at %s", firstDiff(got, want))
						}
					})
				}
			}
			t.Run("errors", func(t *testing.T) {
				out := filepath.Join(dir, "onto-bad")
				for name, c := range map[string]struct {
					base   string
					layers []string
				}{
					"missing base":   {filepath.Join(dir, "nope"), layers[1:2]},
					"directory base": {dir, layers[1:2]},
					"no layers":      {layers[0], nil},
					"bad layer":      {layers[0], []string{filepath.Join(dir, "nope")}},
				} {
					if err := MaterializeOnto(ctx, c.base, c.layers, out); err == nil {
						t.Errorf("%s: MaterializeOnto succeeded", name)
					}
					if _, err := os.Stat(out); err == nil {
						t.Errorf("%s: left %s", name, out)
					}
					noTemp(t, out)
				}
			})
		})
	}
}
