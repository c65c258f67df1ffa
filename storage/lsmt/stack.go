package lsmt

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Stack is an ordered list of sealed layers (bottom first) with an optional
// writable upper on top. Reads are served by the newest layer that maps a
// range; ranges no layer maps read as zeros.
type Stack struct {
	lowers []*Layer
	srcs   []io.ReaderAt // lowers' readers by tag
	upSrc  []io.ReaderAt // the upper's data file
	merged *Index
	upper  *Upper
	size   int64
	locks  rangeLocks // writes of shared blocks (see WriteAt)
}

// StackOptions tune NewStackWith.
type StackOptions struct {
	// AllowReparent accepts sealed layers whose parent UUID does not name the
	// layer below, for tools that re-parent layers on purpose (rebasing a
	// diff onto another base). Everything else wants the check.
	AllowReparent bool
}

// ErrParentMismatch marks a stack whose layers do not chain: a layer's parent
// UUID is not the UUID of the layer below it (a replaced or mis-ordered layer).
var ErrParentMismatch = errors.New("lsmt: layer parent mismatch")

// NewStack builds a stack, checking that every sealed layer but the bottom
// one names the layer below as its parent. The virtual size is the upper's,
// or the top lower's. The stack owns the layers: Close closes them.
func NewStack(lowers []*Layer, upper *Upper) (*Stack, error) {
	return NewStackWith(lowers, upper, StackOptions{})
}

// CheckParents reports the first sealed layer (bottom first) whose parent
// UUID is not the UUID of the layer below, naming both.
func CheckParents(lowers []*Layer) error {
	for i := 1; i < len(lowers); i++ {
		l, below := lowers[i], lowers[i-1]
		if l.ParentUUID() != below.UUID() {
			return fmt.Errorf("%w: layer %d (%s) has parent %s but the layer below it (%s) is %s",
				ErrParentMismatch, i, l.Name(), l.ParentUUID(), below.Name(), below.UUID())
		}
	}
	return nil
}

// NewStackWith is NewStack with options.
func NewStackWith(lowers []*Layer, upper *Upper, opt StackOptions) (*Stack, error) {
	if len(lowers) > MaxLayers {
		return nil, fmt.Errorf("stack of %d layers exceeds the limit of %d", len(lowers), MaxLayers)
	}
	if len(lowers) == 0 && upper == nil {
		return nil, fmt.Errorf("stack has no layers")
	}
	if !opt.AllowReparent {
		if err := CheckParents(lowers); err != nil {
			return nil, err
		}
	}
	idx := make([]*Index, len(lowers))
	for i, l := range lowers {
		idx[i] = l.Index()
	}
	s := &Stack{lowers: lowers, merged: MergeIndexes(idx), upper: upper}
	for _, l := range lowers {
		s.srcs = append(s.srcs, l.r)
	}
	if upper != nil {
		s.upSrc = []io.ReaderAt{upper.data}
	}
	switch {
	case upper != nil:
		s.size = upper.VirtualSize()
	default:
		s.size = lowers[len(lowers)-1].VirtualSize()
	}
	return s, nil
}

// Lowers are the sealed layers, bottom first.
func (s *Stack) Lowers() []*Layer { return s.lowers }

// Upper is the writable layer or nil.
func (s *Stack) Upper() *Upper { return s.upper }

// MergedIndex is the read index of the sealed layers (tags are layer positions).
func (s *Stack) MergedIndex() *Index { return s.merged }

// Size is the virtual disk size in bytes.
func (s *Stack) Size() int64 { return s.size }

func (s *Stack) lowerSource(tag uint8) io.ReaderAt { return s.lowers[tag].r }

// ReadAt reads the virtual disk.
func (s *Stack) ReadAt(p []byte, off int64) (int, error) {
	return readVirtual(p, off, s.size, s.fill)
}

func (s *Stack) fill(p []byte, off int64) error {
	if s.upper == nil {
		return s.fillLower(p, off)
	}
	if len(p) == 0 {
		return nil
	}
	var buf [8]Segment
	s0, n := sectorSpan(off, len(p))
	segs, g, pinned := s.upper.lookupPinned(buf[:0], s0, n)
	if len(segs) == 0 {
		return s.fillLower(p, off)
	}
	err := fpReadLookedUp.Inject()
	if err == nil {
		err = readSegments(p, off, segs, s.upSrc, s.fillLower)
	}
	if pinned {
		s.upper.unpin(g) // the upper may now reuse what a trim freed meanwhile
	}
	return err
}

func (s *Stack) fillLower(p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	var buf [8]Segment
	s0, n := sectorSpan(off, len(p))
	return readSegments(p, off, s.merged.Lookup(buf[:0], s0, n), s.srcs, nil)
}

// WriteAt writes to the upper. Writes that are not aligned to the upper's
// granularity are widened with the current contents (read-modify-write),
// atomically per block: concurrent writes of different bytes of one block
// all survive (a client may write single bytes: we advertise a minimum
// block size of 1), and overlapping ones land in some order.
func (s *Stack) WriteAt(p []byte, off int64) (int, error) {
	if s.upper == nil {
		return 0, fmt.Errorf("write: %w (the stack has no upper layer)", ErrReadOnly)
	}
	if off < 0 || off+int64(len(p)) > s.size {
		return 0, fmt.Errorf("write [%d,+%d) past the virtual size %d", off, len(p), s.size)
	}
	a := s.upper.Align()
	if off%a == 0 && int64(len(p))%a == 0 {
		defer s.locks.lock(off, off+int64(len(p)), false)()
		return s.upper.WriteAt(p, off)
	}
	start := off / a * a
	end := min((off+int64(len(p))+a-1)/a*a, s.size)
	defer s.locks.lock(start, end, true)()
	buf := make([]byte, end-start)
	// Only the partial head and tail blocks need their old contents.
	if err := s.fill(buf[:min(a, end-start)], start); err != nil {
		return 0, err
	}
	if tail := max(end-a, start); tail > start {
		if err := s.fill(buf[tail-start:], tail); err != nil {
			return 0, err
		}
	}
	copy(buf[off-start:], p)
	if _, err := s.upper.WriteAt(buf, start); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Trim makes [off, off+n) read as zeros. Unaligned edges are written as zeros.
func (s *Stack) Trim(off, n int64) error {
	if s.upper == nil {
		return fmt.Errorf("trim: %w (the stack has no upper layer)", ErrReadOnly)
	}
	if off < 0 || n < 0 || off+n > s.size {
		return fmt.Errorf("trim [%d,+%d) past the virtual size %d", off, n, s.size)
	}
	a := s.upper.Align()
	start := (off + a - 1) / a * a
	end := (off + n) / a * a
	if start >= end {
		_, err := s.WriteAt(make([]byte, n), off)
		return err
	}
	if start > off {
		if _, err := s.WriteAt(make([]byte, start-off), off); err != nil {
			return err
		}
	}
	if end < off+n {
		if _, err := s.WriteAt(make([]byte, off+n-end), end); err != nil {
			return err
		}
	}
	defer s.locks.lock(start, end, false)()
	return s.upper.Trim(start, end-start)
}

// Flush makes completed writes durable.
func (s *Stack) Flush() error {
	if s.upper == nil {
		return nil
	}
	return s.upper.Flush()
}

// Commit seals the upper's live contents into a new sealed layer written to w,
// with the top lower as its parent. Zero sectors become zeroed mappings.
func (s *Stack) Commit(ctx context.Context, w io.Writer, message string) (SealResult, error) {
	if s.upper == nil {
		return SealResult{}, fmt.Errorf("commit: the stack has no upper layer")
	}
	if err := s.upper.Flush(); err != nil {
		return SealResult{}, err
	}
	return CommitUpper(ctx, s.upper, s.topUUID(), w, message)
}

func (s *Stack) topUUID() UUID {
	if len(s.lowers) == 0 {
		return UUID{}
	}
	return s.lowers[len(s.lowers)-1].UUID()
}

// CommitUpper seals an upper into w. parent is recorded as the parent uuid.
// Every commit gets a fresh uuid, so committing the same upper twice (after
// more writes) never yields two different layers with one identity.
func CommitUpper(ctx context.Context, u *Upper, parent UUID, w io.Writer, message string) (SealResult, error) {
	segs, release := u.PinnedSegments()
	defer release()
	src := func(uint8) io.ReaderAt { return u.data }
	opt := SealOptions{VirtualSize: uint64(u.VirtualSize()), UUID: NewUUID(), Parent: parent, Message: message, Zero: ZeroMark}
	if parent.IsNil() {
		opt.Parent = u.hdr.ParentUUID
	}
	res, err := WriteSealed(ctx, w, segs, src, opt)
	if err != nil {
		return res, fmt.Errorf("commit upper %s: %w", u.dataPath, err)
	}
	return res, nil
}

// Merge writes one sealed layer equivalent to the sealed layers (bottom first).
// Zero sectors become zeroed mappings; the result's parent is the bottom's parent.
// The layers must chain (see NewStack) unless MergeWith allows re-parenting.
func Merge(ctx context.Context, layers []*Layer, w io.Writer, message string) (SealResult, error) {
	return MergeWith(ctx, layers, w, message, StackOptions{})
}

// MergeWith is Merge with stack options.
func MergeWith(ctx context.Context, layers []*Layer, w io.Writer, message string, so StackOptions) (SealResult, error) {
	if len(layers) == 0 || len(layers) > MaxLayers {
		return SealResult{}, fmt.Errorf("merge: %d layers, need 1..%d", len(layers), MaxLayers)
	}
	st, err := NewStackWith(layers, nil, so)
	if err != nil {
		return SealResult{}, fmt.Errorf("merge: %w", err)
	}
	opt := SealOptions{VirtualSize: uint64(st.Size()), Parent: layers[0].ParentUUID(), Message: message, Zero: ZeroMark}
	return WriteSealed(ctx, w, st.merged.Segments(), st.lowerSource, opt)
}

// Close closes every layer.
func (s *Stack) Close() error {
	var err error
	if s.upper != nil {
		err = s.upper.Close()
	}
	for _, l := range s.lowers {
		if cerr := l.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
