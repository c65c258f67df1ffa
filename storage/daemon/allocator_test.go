package daemon

import (
	"slices"
	"testing"
)

func TestIDAllocator(t *testing.T) {
	t.Parallel()
	a := newIDAllocator(4)
	if !a.reserve(1) || a.reserve(1) || a.reserve(4) {
		t.Fatal("reserve: want true for a free id, false for a used or out-of-range one")
	}
	var got []uint32
	for range 3 {
		id, ok := a.alloc()
		if !ok {
			t.Fatal("alloc failed with free ids left")
		}
		got = append(got, id)
	}
	if !slices.Equal(got, []uint32{0, 2, 3}) {
		t.Fatalf("alloc order %v, want smallest free first", got)
	}
	if _, ok := a.alloc(); ok {
		t.Fatal("alloc succeeded with every id in use")
	}
	a.free(2)
	if id, ok := a.alloc(); !ok || id != 2 {
		t.Fatalf("after free(2): alloc = %d %v", id, ok)
	}
}
