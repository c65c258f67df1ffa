package rpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	t.Parallel()
	cases := []Request{
		{ID: 1, Method: MethodFeatures},
		{ID: 2, Method: MethodCreate, Params: []byte(`{"image":"/x/image.json","size":1048576}`)},
	}
	var buf bytes.Buffer
	for _, c := range cases {
		if err := WriteFrame(&buf, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range cases {
		var got Request
		if err := ReadFrame(&buf, &got); err != nil {
			t.Fatal(err)
		}
		if got.ID != want.ID || got.Method != want.Method || !bytes.Equal(got.Params, want.Params) {
			t.Fatalf("got %+v want %+v", got, want)
		}
	}
}

func TestFrameErrors(t *testing.T) {
	t.Parallel()
	huge := binary.BigEndian.AppendUint32(nil, MaxFrame+1)
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"too large", huge, ErrFrameTooLarge},
		{"truncated", append(binary.BigEndian.AppendUint32(nil, 10), '{'), nil},
		{"not json", append(binary.BigEndian.AppendUint32(nil, 3), "abc"...), nil},
	}
	for _, c := range cases {
		var r Request
		err := ReadFrame(bytes.NewReader(c.in), &r)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
}

func TestErrorIs(t *testing.T) {
	t.Parallel()
	var err error = &Error{Code: CodeNotFound, Message: "device 3"}
	if !errors.Is(err, &Error{Code: CodeNotFound}) || errors.Is(err, &Error{Code: CodeLost}) {
		t.Fatal("errors.Is does not match on the code")
	}
}

// TestErrorSentinels: every code maps to exactly the sentinels documented,
// through any wrapping.
func TestErrorSentinels(t *testing.T) {
	t.Parallel()
	all := []error{ErrNotFound, ErrConflict, ErrCapacity, ErrInvalid, ErrInternal, ErrLost, ErrShuttingDown}
	cases := []struct {
		code string
		want []error
	}{
		{CodeNotFound, []error{ErrNotFound}},
		{CodeConflict, []error{ErrConflict}},
		{CodeCapacity, []error{ErrCapacity}},
		{CodeInvalid, []error{ErrInvalid}},
		{CodeInternal, []error{ErrInternal}},
		{CodeLost, []error{ErrLost, ErrConflict}},
		{CodeShuttingDown, []error{ErrShuttingDown, ErrCapacity}},
		{"from-a-newer-daemon", []error{ErrInternal}},
	}
	for _, c := range cases {
		err := fmt.Errorf("wrapped: %w", &Error{Code: c.code, Message: "m"})
		for _, s := range all {
			if got, want := errors.Is(err, s), slices.Contains(c.want, s); got != want {
				t.Errorf("code %s: errors.Is(%v) = %v, want %v", c.code, s, got, want)
			}
		}
	}
}

// FuzzReadFrame: arbitrary bytes never panic the frame reader, and any frame
// it accepts re-encodes to a frame it accepts again.
func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	WriteFrame(&buf, Request{ID: 9, Method: MethodRestack, Params: []byte(`{"id":3}`)})
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		if ReadFrame(bytes.NewReader(b), &r) != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteFrame(&out, r); err != nil {
			t.Fatal(err)
		}
		var again Request
		if err := ReadFrame(&out, &again); err != nil || again.ID != r.ID || again.Method != r.Method {
			t.Fatalf("re-decode: %v %+v vs %+v", err, again, r)
		}
	})
}

func TestChooseBlock(t *testing.T) {
	for _, c := range []struct {
		f         Features
		speaksNBD bool
		want      string
	}{
		{Features{Ublk: true, KernelNBD: true}, false, BlockUblk},
		{Features{Ublk: true, KernelNBD: true}, true, BlockUblk},
		{Features{Ublk: true}, true, BlockUblk},
		{Features{KernelNBD: true}, false, BlockNBD},
		{Features{KernelNBD: true}, true, BlockNone},
		{Features{}, false, BlockNone},
		{Features{}, true, BlockNone},
	} {
		if got := ChooseBlock(c.f, c.speaksNBD); got != c.want {
			t.Errorf("ChooseBlock(ublk=%v, kernel nbd=%v, vmm speaks nbd=%v) = %q, want %q", c.f.Ublk, c.f.KernelNBD, c.speaksNBD, got, c.want)
		}
	}
}

func TestBlockKind(t *testing.T) {
	for _, c := range []struct {
		block  string
		kernel bool
		want   string
		ok     bool
	}{
		{"", false, BlockNone, true},
		{"", true, BlockNBD, true},
		{"nbd", true, BlockNBD, true},
		{"ublk", false, BlockUblk, true},
		{"ublk", true, "", false},
		{"loop", false, "", false},
	} {
		got, err := BlockKind(c.block, c.kernel)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("BlockKind(%q, %v) = %q, %v; want %q, ok %v", c.block, c.kernel, got, err, c.want, c.ok)
		}
	}
}
