package migstream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// builder writes streams in QEMU 7.2's layout (see the package comment).
type builder struct{ bytes.Buffer }

func (b *builder) u8(v byte)    { b.WriteByte(v) }
func (b *builder) u32(v uint32) { _ = binary.Write(&b.Buffer, binary.BigEndian, v) }
func (b *builder) u64(v uint64) { _ = binary.Write(&b.Buffer, binary.BigEndian, v) }
func (b *builder) str8(s string) {
	b.u8(byte(len(s)))
	b.WriteString(s)
}

func (b *builder) header() *builder {
	b.u32(fileMagic)
	b.u32(fileVersion)
	return b
}

// config writes the configuration section with a capabilities subsection.
func (b *builder) config(caps ...string) *builder {
	b.u8(secConfiguration)
	b.u32(7)
	b.WriteString("microvm")
	if len(caps) > 0 {
		b.u8(secSubsection)
		b.str8(capsSubsection)
		b.u32(1)
		b.u32(uint32(len(caps)))
		for _, c := range caps {
			b.str8(c)
		}
	}
	return b
}

type blk struct {
	name      string
	length    uint64
	gpa       uint64
	hasGPA    bool
	pageBytes byte
}

// startRAM writes the RAM section's START with its block list.
func (b *builder) startRAM(id uint32, blocks ...blk) *builder {
	b.u8(secStart)
	b.u32(id)
	b.str8("ram")
	b.u32(0) // instance
	b.u32(4) // version
	var total uint64
	for _, bl := range blocks {
		total += bl.length
	}
	b.u64(total | flagMemSize)
	for _, bl := range blocks {
		b.str8(bl.name)
		b.u64(bl.length)
		if bl.hasGPA {
			b.u64(bl.gpa)
		}
	}
	return b
}

func (b *builder) page(block string, addr uint64, cont bool, fill byte) *builder {
	flags := uint64(flagPage)
	if cont {
		flags |= flagContinue
	}
	b.u64(addr | flags)
	if !cont {
		b.str8(block)
	}
	b.Write(bytes.Repeat([]byte{fill}, defaultPageSize))
	return b
}

func (b *builder) zero(block string, addr uint64, cont bool) *builder {
	flags := uint64(flagZero)
	if cont {
		flags |= flagContinue
	}
	b.u64(addr | flags)
	if !cont {
		b.str8(block)
	}
	b.u8(0)
	return b
}

func (b *builder) eos() *builder { b.u64(flagEOS); return b }

func (b *builder) footer(id uint32) *builder {
	b.u8(secFooter)
	b.u32(id)
	return b
}

func (b *builder) part(typ byte, id uint32) *builder {
	b.u8(typ)
	b.u32(id)
	return b
}

// devices writes what follows the RAM section: one device section, EOF and
// a JSON description. The filter never parses it.
func (b *builder) devices() *builder {
	b.u8(secFull)
	b.u32(9)
	b.str8("timer")
	b.u32(0)
	b.u32(2)
	b.Write([]byte{0xde, 0xad, 0xbe, 0xef, secFooter, 0xff}) // opaque to the filter
	b.footer(9)
	b.u8(secEOF)
	desc := `{"page_size": 4096, "devices": []}`
	b.u8(secVMDescription)
	b.u32(uint32(len(desc)))
	b.WriteString(desc)
	return b
}

var (
	mem = blk{name: "mem", length: 64 * defaultPageSize, gpa: 0, hasGPA: true}
	rom = blk{name: "pc.bios", length: 4 * defaultPageSize, gpa: 0xfffc0000, hasGPA: true}
)

var drop = Options{DropBlocks: []string{"mem"}}

// stream is a full stream with mem pages in every section, and want is it
// without them.
func stream(withMem bool) []byte {
	b := new(builder).header().config(ignoreSharedCap).startRAM(2, mem, rom)
	b.page("pc.bios", 0, false, 0xb1)
	if withMem {
		b.page("mem", 0, false, 0x11).zero("mem", defaultPageSize, true)
	}
	b.page("pc.bios", defaultPageSize, false, 0xb2).eos().footer(2)
	b.part(secPart, 2)
	if withMem {
		b.page("mem", 5*defaultPageSize, false, 0x55).page("mem", 6*defaultPageSize, true, 0x66)
	}
	b.zero("pc.bios", 2*defaultPageSize, false).zero("pc.bios", 3*defaultPageSize, true)
	b.eos().footer(2)
	b.part(secEnd, 2)
	if withMem {
		b.page("mem", 63*defaultPageSize, false, 0x77)
	}
	b.eos().footer(2)
	return b.devices().Bytes()
}

func TestFilterDropsGuestRAM(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	st, err := Filter(&out, bytes.NewReader(stream(true)), drop)
	if err != nil {
		t.Fatal(err)
	}
	if want := stream(false); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("output differs from the stream without mem pages:\n got %d bytes\nwant %d bytes", out.Len(), len(want))
	}
	if st.DroppedPages != 4 || st.DroppedZeroPages != 1 || st.KeptPages != 4 {
		t.Errorf("stats %+v: want 4 dropped pages, 1 dropped zero page, 4 kept", st)
	}
	if st.BytesOut != int64(out.Len()) || st.BytesIn != int64(len(stream(true))) {
		t.Errorf("byte counts %d/%d", st.BytesIn, st.BytesOut)
	}
	if len(st.Blocks) != 2 || st.Blocks[0] != (Block{"mem", mem.length}) || len(st.Capabilities) != 1 {
		t.Errorf("blocks %+v capabilities %v", st.Blocks, st.Capabilities)
	}
}

// TestFilterWithoutFootersOrCapabilities: old machine types send no section
// footers; without x-ignore-shared the block list has no addresses.
func TestFilterWithoutFootersOrCapabilities(t *testing.T) {
	t.Parallel()
	plain := func(withMem bool) []byte {
		b := new(builder).header().config().startRAM(3, blk{name: "mem", length: 8 * defaultPageSize})
		b.eos().part(secEnd, 3)
		if withMem {
			b.page("mem", 0, false, 1).page("mem", defaultPageSize, true, 2)
		}
		return b.eos().devices().Bytes()
	}
	var out bytes.Buffer
	if _, err := Filter(&out, bytes.NewReader(plain(true)), drop); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), plain(false)) {
		t.Fatal("output is not the stream without mem pages")
	}
}

func TestFilterRefuses(t *testing.T) {
	t.Parallel()
	ram := func() *builder { return new(builder).header().config(ignoreSharedCap).startRAM(2, mem, rom) }
	record := func(flags uint64) []byte {
		b := ram()
		b.u64(flags)
		b.str8("mem")
		b.Write(make([]byte, 64))
		return b.Bytes()
	}
	tests := []struct {
		name        string
		in          []byte
		opts        Options
		want        string
		unsupported bool
	}{
		{"xbzrle", record(flagXBZRLE), drop, "XBZRLE", true},
		{"compressed", record(flagCompressPage), drop, "compressed page", true},
		{"rdma hook", record(flagHook), drop, "RDMA", true},
		{"multifd flush", record(flagMultifdFlush), drop, "multifd", true},
		{"unknown flag", record(0x400), drop, "unknown flags", true},
		{"obsolete full", record(flagFull), drop, "obsolete", true},
		{"other iterable section", func() []byte {
			b := new(builder).header().config()
			b.u8(secStart)
			b.u32(1)
			b.str8("block")
			return b.Bytes()
		}(), drop, `iterable section "block"`, true},
		{"device section inside RAM", func() []byte {
			b := ram().eos().footer(2)
			b.u8(secFull)
			return b.Bytes()
		}(), drop, "device section before", true},
		{"eof inside RAM", func() []byte { b := ram().eos().footer(2); b.u8(secEOF); return b.Bytes() }(), drop, "ended before", true},
		{"command", func() []byte { b := ram().eos().footer(2); b.u8(secCommand); return b.Bytes() }(), drop, "command", true},
		{"unknown section type", func() []byte { b := ram().eos().footer(2); b.u8(0x42); return b.Bytes() }(), drop, "unknown section type", true},
		{"part of another section", func() []byte { b := ram().eos().footer(2); return b.part(secPart, 7).Bytes() }(), drop, "not the RAM section", true},
		{"unknown config subsection", func() []byte {
			b := new(builder).header().config()
			b.u8(secSubsection)
			b.str8("configuration/new-thing")
			b.u32(1)
			return b.Bytes()
		}(), drop, "new-thing", true},
		{"stream version", func() []byte { b := new(builder); b.u32(fileMagic); b.u32(2); return b.Bytes() }(), drop, "version 2", true},
		{"bad magic", []byte("not a migration stream at all"), drop, "magic", false},
		{"drop block missing", ram().Bytes(), Options{DropBlocks: []string{"ram0"}}, `"ram0" is not in the stream`, false},
		{"no drop block", stream(true), Options{}, "no RAM block", false},
		{"page of unlisted block", func() []byte { return ram().page("other", 0, false, 1).Bytes() }(), drop, `unknown RAM block "other"`, false},
		{"page beyond block", func() []byte { return ram().page("pc.bios", rom.length, false, 1).Bytes() }(), drop, "beyond RAM block", false},
		{"continue without block", func() []byte { return ram().page("", 0, true, 1).Bytes() }(), drop, "continues no block", false},
		{"block list larger than total", func() []byte {
			b := new(builder).header().config()
			b.u8(secStart)
			b.u32(1)
			b.str8("ram")
			b.u32(0)
			b.u32(4)
			b.u64(defaultPageSize | flagMemSize)
			b.str8("mem")
			b.u64(2 * defaultPageSize)
			return b.Bytes()
		}(), drop, "remaining bytes", false},
		{"block list twice", func() []byte { b := ram(); b.u64(defaultPageSize | flagMemSize); return b.Bytes() }(), drop, "out of place", false},
		{"footer of another section", func() []byte { return ram().eos().footer(5).Bytes() }(), drop, "footer of section 5", false},
		{"second configuration", func() []byte { return new(builder).header().config().config().Bytes() }(), drop, "configuration section out of place", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Filter(io.Discard, bytes.NewReader(tc.in), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if errors.Is(err, ErrUnsupported) != tc.unsupported {
				t.Fatalf("errors.Is(%v, ErrUnsupported) = %v, want %v", err, !tc.unsupported, tc.unsupported)
			}
		})
	}
}

// TestFilterTruncated: every proper prefix that ends inside the RAM section
// is an error (a stream cut short must not pass as a snapshot).
func TestFilterTruncated(t *testing.T) {
	t.Parallel()
	full := stream(true)
	ramEnd := bytes.Index(full, []byte{secFull, 0, 0, 0, 9})
	if ramEnd < 0 {
		t.Fatal("test stream has no device section")
	}
	// Every cut in the headers; past them, cuts spread over the pages.
	for n := 0; n < ramEnd; n += map[bool]int{true: 1, false: 61}[n < 600] {
		if _, err := Filter(io.Discard, bytes.NewReader(full[:n]), drop); err == nil {
			t.Fatalf("prefix of %d bytes (RAM ends at %d) accepted", n, ramEnd)
		}
	}
}

// TestFilterWriteError: a failing destination is reported, not swallowed.
func TestFilterWriteError(t *testing.T) {
	t.Parallel()
	_, err := Filter(failWriter{}, bytes.NewReader(stream(true)), drop)
	if err == nil {
		t.Fatal("write error swallowed")
	}
}

// TestFilterMaxOutput: the output bound stops a stream whose kept part is
// larger than allowed.
func TestFilterMaxOutput(t *testing.T) {
	t.Parallel()
	want := int64(len(stream(false)))
	for _, limit := range []int64{want, 1 << 20} {
		var out bytes.Buffer
		if _, err := Filter(&out, bytes.NewReader(stream(true)), Options{DropBlocks: []string{"mem"}, MaxOutput: limit}); err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	_, err := Filter(io.Discard, bytes.NewReader(stream(true)), Options{DropBlocks: []string{"mem"}, MaxOutput: want - 1})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("output of %d bytes with a limit of %d: got %v, want ErrTooLarge", want, want-1, err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// A device state written by QEMU 7.2 for a 256 MiB microvm guest (with
// x-ignore-shared, guest RAM pages already dropped): filtering it again
// changes nothing.
const realStateFile = "testdata/qemu72-microvm-devstate.bin"

func TestFilterRealDeviceState(t *testing.T) {
	t.Parallel()
	in, err := os.ReadFile(realStateFile)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := Filter(&out, bytes.NewReader(in), drop)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in) || st.DroppedPages+st.DroppedZeroPages != 0 || st.KeptPages == 0 {
		t.Fatalf("refiltering a device state: equal %v, stats %+v", bytes.Equal(out.Bytes(), in), st)
	}
}

// TestFilterMutatedStreams runs FuzzFilter's check on randomly corrupted
// streams (fixed seed) in every `go test`.
func TestFilterMutatedStreams(t *testing.T) {
	t.Parallel()
	seeds := [][]byte{stream(true), stream(false)}
	if b, err := os.ReadFile(realStateFile); err == nil {
		seeds = append(seeds, b)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 600 {
		data := bytes.Clone(seeds[i%len(seeds)])
		for range 1 + r.IntN(6) {
			// Mostly the structured start, where a corrupt byte matters.
			at := r.IntN(min(len(data), 2048))
			if r.IntN(4) == 0 {
				at = r.IntN(len(data))
			}
			data[at] = byte(r.IntN(256))
		}
		if r.IntN(3) == 0 {
			data = data[:r.IntN(len(data))]
		}
		checkFixedPoint(t, data)
	}
}

func checkFixedPoint(t *testing.T, in []byte) {
	t.Helper()
	var out bytes.Buffer
	if _, err := Filter(&out, bytes.NewReader(in), drop); err != nil {
		return
	}
	var again bytes.Buffer
	if _, err := Filter(&again, bytes.NewReader(out.Bytes()), drop); err != nil {
		t.Fatalf("output of an accepted stream is refused: %v", err)
	}
	if !bytes.Equal(again.Bytes(), out.Bytes()) {
		t.Fatal("filtering is not idempotent")
	}
}

// FuzzFilter: hostile streams give errors, never panics; whatever passes is
// a fixed point (filtering the output again yields it unchanged).
func FuzzFilter(f *testing.F) {
	f.Add(stream(true))
	f.Add(stream(false))
	if b, err := os.ReadFile(realStateFile); err == nil {
		f.Add(b)
	}
	f.Fuzz(checkFixedPoint)
}
