// Package migstream rewrites a QEMU migration stream on the fly: it drops the
// page records of chosen RAM blocks (the guest RAM) and copies everything
// else verbatim, so a snapshot of a VM whose RAM is privately mapped holds
// only device state. The caller provides the RAM itself as a memory file.
//
// It understands exactly the precopy stream QEMU 7.2 writes for our machines
// (file magic, configuration section, the iterable "ram" section in START,
// PART and END sections with optional footers) and refuses anything else with
// an error that names what it met, so callers can fall back to a full
// snapshot. Everything after the end of the "ram" section (device sections,
// EOF, the JSON description) is copied without being parsed.
//
// Stream facts (QEMU migration/savevm.c, migration/savevm.h, migration/ram.c):
// integers are big-endian; a section header is a type byte and a 32-bit
// section id, START and FULL headers add a length-prefixed idstr, an instance
// id and a version id; with footers enabled each section ends with 0x7e and
// its id. RAM data is a sequence of 64-bit words "page offset | flags" (flags
// in the bits below the target page size); unless CONTINUE is set a
// length-prefixed RAM block idstr follows; a ZERO record carries one fill
// byte, a PAGE record one target page; EOS ends the section's RAM data.
// The block list in the START section has, per block, its idstr, its used
// length, its page size only when postcopy-ram is on and the block's page
// size differs from the host's (not visible in the stream: the source must
// not enable postcopy-ram), and its guest address when x-ignore-shared is on
// (visible in the configuration section's capabilities subsection).
package migstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// Stream constants from QEMU's migration/savevm.h.
const (
	fileMagic   = 0x5145564d // "QEVM"
	fileVersion = 3

	secEOF           = 0x00
	secStart         = 0x01
	secPart          = 0x02
	secEnd           = 0x03
	secFull          = 0x04
	secSubsection    = 0x05
	secVMDescription = 0x06
	secConfiguration = 0x07
	secCommand       = 0x08
	secFooter        = 0x7e
)

// RAM record flags from QEMU's migration/ram.c.
const (
	flagFull          = 0x01 // obsolete
	flagZero          = 0x02
	flagMemSize       = 0x04
	flagPage          = 0x08
	flagEOS           = 0x10
	flagContinue      = 0x20
	flagXBZRLE        = 0x40
	flagHook          = 0x80 // RDMA
	flagCompressPage  = 0x100
	flagMultifdFlush  = 0x200 // QEMU 8.0 and later
	defaultPageSize   = 4096  // TARGET_PAGE_SIZE of x86
	maxConfigNameLen  = 256
	maxCapabilities   = 256
	maxRAMBlocks      = 1024
	ramSectionIDStr   = "ram"
	ignoreSharedCap   = "x-ignore-shared"
	capsSubsection    = "configuration/capabilities"
	pageBitsSubsect   = "configuration/target-page-bits"
	uuidSubsection    = "configuration/uuid"
	minTargetPageBits = 12
	maxTargetPageBits = 16
)

// ErrUnsupported wraps every error about a stream feature this filter does
// not handle (as opposed to a truncated or malformed stream).
var ErrUnsupported = errors.New("migstream: unsupported stream content")

// Options say which RAM blocks lose their pages.
type Options struct {
	// DropBlocks are the idstrs of RAM blocks whose page records are left
	// out (for our machines "mem", the memory backend). Each must appear in
	// the stream's RAM block list, or Filter fails: a renamed block would
	// otherwise silently put all of RAM into the output.
	DropBlocks []string
	// MaxOutput bounds the bytes written (0: no bound), so a misbehaving
	// VMM cannot fill the disk with what should be a small device state.
	MaxOutput int64
}

// ErrTooLarge is returned when the output would exceed Options.MaxOutput.
var ErrTooLarge = errors.New("migstream: output exceeds its limit")

// Block is one RAM block announced by the stream.
type Block struct {
	Name   string
	Length uint64
}

// Stats describe one filtered stream.
type Stats struct {
	BytesIn, BytesOut int64
	Blocks            []Block
	// DroppedPages and DroppedZeroPages count records left out;
	// KeptPages counts page and zero records of other blocks.
	DroppedPages, DroppedZeroPages, KeptPages int64
	Capabilities                              []string
}

// Filter copies the migration stream src to dst without the page records of
// opts.DropBlocks. It reads src to its end. On error, dst holds a prefix of
// the output and must be discarded.
func Filter(dst io.Writer, src io.Reader, opts Options) (*Stats, error) {
	if len(opts.DropBlocks) == 0 {
		return nil, errors.New("migstream: no RAM block to drop given")
	}
	cr := &countingReader{r: src}
	cw := &countingWriter{w: dst, limit: opts.MaxOutput}
	f := &filter{
		in:       bufio.NewReaderSize(cr, 128<<10),
		out:      bufio.NewWriterSize(cw, 64<<10),
		drop:     map[string]bool{},
		pageSize: defaultPageSize,
		blocks:   map[string]uint64{},
		stats:    &Stats{},
	}
	for _, b := range opts.DropBlocks {
		f.drop[b] = true
	}
	err := f.run()
	if ferr := f.out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("migstream: write: %w", ferr)
	}
	f.stats.BytesIn, f.stats.BytesOut = cr.n, cw.n
	if err != nil {
		return f.stats, err
	}
	return f.stats, nil
}

type filter struct {
	in    *bufio.Reader
	out   *bufio.Writer
	drop  map[string]bool
	stats *Stats

	pageSize     uint64
	ignoreShared bool
	configSeen   bool

	ramStarted bool
	ramID      uint32
	blocks     map[string]uint64 // RAM block lengths from the MEM_SIZE list
	// curBlock is the block the last record named (what CONTINUE refers to
	// in the input); lastOut is the block of the last record written (what
	// CONTINUE refers to for the reader of the output).
	curBlock, lastOut string
}

func (f *filter) run() error {
	magic, err := f.u32()
	if err != nil {
		return err
	}
	version, err := f.u32()
	if err != nil {
		return err
	}
	if magic != fileMagic {
		return fmt.Errorf("migstream: not a migration stream (magic %#x)", magic)
	}
	if version != fileVersion {
		return fmt.Errorf("%w: stream version %d (want %d)", ErrUnsupported, version, fileVersion)
	}
	f.putU32(magic)
	f.putU32(version)
	for {
		typ, err := f.u8()
		if err != nil {
			return err
		}
		done, err := f.section(typ)
		if err != nil {
			return err
		}
		if done {
			break
		}
	}
	// The RAM section ended: the rest is device state, EOF and the JSON
	// description, which QEMU's loader parses; pass it through untouched.
	if _, err := io.Copy(f.out, f.in); err != nil {
		return fmt.Errorf("migstream: copy device state: %w", err)
	}
	return nil
}

// section handles one top-level item of type typ; done reports the end of
// the "ram" section's END part.
func (f *filter) section(typ byte) (done bool, err error) {
	switch typ {
	case secConfiguration:
		if f.configSeen || f.ramStarted {
			return false, errors.New("migstream: configuration section out of place")
		}
		f.configSeen = true
		f.putU8(typ)
		return false, f.configuration()
	case secStart:
		return false, f.startSection()
	case secPart, secEnd:
		id, err := f.u32()
		if err != nil {
			return false, err
		}
		if !f.ramStarted || id != f.ramID {
			return false, fmt.Errorf("%w: iterable section %d is not the RAM section", ErrUnsupported, id)
		}
		f.putU8(typ)
		f.putU32(id)
		if err := f.ramData(false); err != nil {
			return false, err
		}
		return typ == secEnd, f.footer(id)
	case secFull:
		return false, fmt.Errorf("%w: device section before the RAM section ended", ErrUnsupported)
	case secEOF:
		return false, fmt.Errorf("%w: stream ended before the RAM section ended", ErrUnsupported)
	case secCommand:
		return false, fmt.Errorf("%w: migration command (postcopy, COLO or return path)", ErrUnsupported)
	case secVMDescription, secSubsection, secFooter:
		return false, fmt.Errorf("migstream: section type %#x out of place", typ)
	default:
		return false, fmt.Errorf("%w: unknown section type %#x", ErrUnsupported, typ)
	}
}

// configuration parses the configuration section: the machine type name
// and the subsections QEMU 7.2 may add.
func (f *filter) configuration() error {
	n, err := f.u32()
	if err != nil {
		return err
	}
	if n > maxConfigNameLen {
		return fmt.Errorf("migstream: machine type name of %d bytes", n)
	}
	f.putU32(n)
	if _, err := f.bytes(int(n)); err != nil {
		return err
	}
	for {
		next, err := f.in.Peek(1)
		if err != nil {
			return f.readErr(err)
		}
		if next[0] != secSubsection {
			return nil
		}
		_, _ = f.u8()
		f.putU8(secSubsection)
		name, err := f.str8()
		if err != nil {
			return err
		}
		version, err := f.u32()
		if err != nil {
			return err
		}
		f.putU32(version)
		if err := f.configSubsection(name); err != nil {
			return err
		}
	}
}

func (f *filter) configSubsection(name string) error {
	switch name {
	case capsSubsection:
		n, err := f.u32()
		if err != nil {
			return err
		}
		if n > maxCapabilities {
			return fmt.Errorf("migstream: %d capabilities", n)
		}
		f.putU32(n)
		for range n {
			c, err := f.str8()
			if err != nil {
				return err
			}
			f.stats.Capabilities = append(f.stats.Capabilities, c)
			if c == ignoreSharedCap {
				f.ignoreShared = true
			}
		}
		return nil
	case pageBitsSubsect:
		bits, err := f.u32()
		if err != nil {
			return err
		}
		if bits < minTargetPageBits || bits > maxTargetPageBits {
			return fmt.Errorf("%w: target page bits %d", ErrUnsupported, bits)
		}
		f.putU32(bits)
		f.pageSize = 1 << bits
		return nil
	case uuidSubsection:
		_, err := f.bytes(16)
		return err
	default:
		return fmt.Errorf("%w: configuration subsection %q", ErrUnsupported, name)
	}
}

func (f *filter) startSection() error {
	id, err := f.u32()
	if err != nil {
		return err
	}
	idstr, err := f.str8NoCopy()
	if err != nil {
		return err
	}
	if idstr != ramSectionIDStr {
		return fmt.Errorf("%w: iterable section %q", ErrUnsupported, idstr)
	}
	if f.ramStarted {
		return errors.New("migstream: second RAM section")
	}
	f.ramStarted, f.ramID = true, id
	f.putU8(secStart)
	f.putU32(id)
	f.putStr8(idstr)
	for range 2 { // instance id, version id
		v, err := f.u32()
		if err != nil {
			return err
		}
		f.putU32(v)
	}
	if err := f.ramData(true); err != nil {
		return err
	}
	return f.footer(id)
}

// footer copies a section footer when the stream has them (QEMU writes
// them unless an old machine type turned them off).
func (f *filter) footer(id uint32) error {
	next, err := f.in.Peek(1)
	if err != nil {
		return f.readErr(err)
	}
	if next[0] != secFooter {
		return nil
	}
	_, _ = f.u8()
	got, err := f.u32()
	if err != nil {
		return err
	}
	if got != id {
		return fmt.Errorf("migstream: footer of section %d ends section %d", got, id)
	}
	f.putU8(secFooter)
	f.putU32(got)
	return nil
}

// ramData filters RAM records up to and including EOS.
func (f *filter) ramData(start bool) error {
	first := true
	for {
		word, err := f.u64()
		if err != nil {
			return err
		}
		flags := word & (f.pageSize - 1)
		addr := word &^ (f.pageSize - 1)
		switch {
		case flags == flagMemSize:
			if !start || !first {
				return errors.New("migstream: RAM block list out of place")
			}
			f.putU64(word)
			if err := f.blockList(addr); err != nil {
				return err
			}
		case flags == flagEOS:
			f.putU64(word)
			return nil
		case flags&^flagContinue == flagZero:
			if err := f.pageRecord(addr, flags, 1); err != nil {
				return err
			}
		case flags&^flagContinue == flagPage:
			if err := f.pageRecord(addr, flags, int64(f.pageSize)); err != nil {
				return err
			}
		default:
			return unsupportedFlags(flags)
		}
		first = false
	}
}

func unsupportedFlags(flags uint64) error {
	var what string
	switch {
	case flags&flagXBZRLE != 0:
		what = "XBZRLE-encoded page (xbzrle capability)"
	case flags&flagCompressPage != 0:
		what = "compressed page (compress capability)"
	case flags&flagHook != 0:
		what = "RDMA hook"
	case flags&flagMultifdFlush != 0:
		what = "multifd flush (multifd capability)"
	case flags&flagFull != 0:
		what = "obsolete FULL page"
	case flags&flagMemSize != 0:
		what = "RAM block list combined with other flags"
	default:
		what = "unknown flags"
	}
	return fmt.Errorf("%w: RAM record flags %#x: %s", ErrUnsupported, flags, what)
}

// blockList copies the MEM_SIZE list: total bytes, then per block its idstr,
// used length and (with x-ignore-shared) its guest address.
func (f *filter) blockList(total uint64) error {
	for total > 0 {
		if len(f.blocks) >= maxRAMBlocks {
			return fmt.Errorf("migstream: more than %d RAM blocks", maxRAMBlocks)
		}
		name, err := f.str8()
		if err != nil {
			return err
		}
		length, err := f.u64()
		if err != nil {
			return err
		}
		f.putU64(length)
		if name == "" || length == 0 || length > total {
			return fmt.Errorf("migstream: RAM block %q of %d bytes in a list of %d remaining bytes", name, length, total)
		}
		if _, dup := f.blocks[name]; dup {
			return fmt.Errorf("migstream: RAM block %q listed twice", name)
		}
		if f.ignoreShared {
			gpa, err := f.u64()
			if err != nil {
				return err
			}
			f.putU64(gpa)
		}
		f.blocks[name] = length
		f.stats.Blocks = append(f.stats.Blocks, Block{Name: name, Length: length})
		total -= length
	}
	for name := range f.drop {
		if _, ok := f.blocks[name]; !ok {
			return fmt.Errorf("migstream: RAM block %q is not in the stream", name)
		}
	}
	return nil
}

// pageRecord handles a ZERO or PAGE record whose payload is n bytes.
func (f *filter) pageRecord(addr, flags uint64, n int64) error {
	if flags&flagContinue == 0 {
		name, err := f.str8NoCopy()
		if err != nil {
			return err
		}
		f.curBlock = name
	} else if f.curBlock == "" {
		return errors.New("migstream: page record continues no block")
	}
	length, ok := f.blocks[f.curBlock]
	if !ok {
		return fmt.Errorf("migstream: page record for unknown RAM block %q", f.curBlock)
	}
	if addr >= length {
		return fmt.Errorf("migstream: page %#x beyond RAM block %q of %d bytes", addr, f.curBlock, length)
	}
	if f.drop[f.curBlock] {
		if _, err := f.in.Discard(int(n)); err != nil {
			return f.readErr(err)
		}
		if n == 1 {
			f.stats.DroppedZeroPages++
		} else {
			f.stats.DroppedPages++
		}
		return nil
	}
	// A kept record may say CONTINUE while the reader of our output last
	// saw another block (only if dropped records sat between them): name it.
	if flags&flagContinue != 0 && f.lastOut != f.curBlock {
		flags &^= flagContinue
	}
	f.putU64(addr | flags)
	if flags&flagContinue == 0 {
		f.putStr8(f.curBlock)
	}
	if _, err := io.CopyN(f.out, f.in, n); err != nil {
		return f.readErr(err)
	}
	f.lastOut = f.curBlock
	f.stats.KeptPages++
	return nil
}
