package migstream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The stream's primitive reads and writes (big-endian integers, one-byte
// length-prefixed strings) and the byte counters of Stats.

// Reading helpers. The ones without "NoCopy" in their name, and bytes,
// also write what they read.

func (f *filter) readErr(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("migstream: read: %w", err)
}

func (f *filter) u8() (byte, error) {
	b, err := f.in.ReadByte()
	if err != nil {
		return 0, f.readErr(err)
	}
	return b, nil
}

func (f *filter) u32() (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(f.in, b[:]); err != nil {
		return 0, f.readErr(err)
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

func (f *filter) u64() (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(f.in, b[:]); err != nil {
		return 0, f.readErr(err)
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// bytes copies n bytes (n is bounded by the callers) to the output.
func (f *filter) bytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(f.in, b); err != nil {
		return nil, f.readErr(err)
	}
	_, _ = f.out.Write(b)
	return b, nil
}

// str8NoCopy reads a string with a one-byte length prefix.
func (f *filter) str8NoCopy() (string, error) {
	n, err := f.u8()
	if err != nil {
		return "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(f.in, b); err != nil {
		return "", f.readErr(err)
	}
	return string(b), nil
}

// str8 reads a string with a one-byte length prefix and copies it.
func (f *filter) str8() (string, error) {
	s, err := f.str8NoCopy()
	if err == nil {
		f.putStr8(s)
	}
	return s, err
}

// Writes go to a bufio.Writer whose first error sticks and is reported by
// the final Flush, so the put helpers need not return one.

func (f *filter) putU8(b byte) { _ = f.out.WriteByte(b) }

func (f *filter) putU32(v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	_, _ = f.out.Write(b[:])
}

func (f *filter) putU64(v uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	_, _ = f.out.Write(b[:])
}

func (f *filter) putStr8(s string) {
	f.putU8(byte(len(s)))
	_, _ = f.out.WriteString(s)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type countingWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		return 0, fmt.Errorf("%w (%d bytes)", ErrTooLarge, c.limit)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
