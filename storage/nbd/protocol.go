// Package nbd owns AgentENV's Network Block Device server: the fixed-newstyle
// handshake, the transmission phase with many requests in flight per
// connection, and a small client used by tests and tools. It serves anything
// that implements Backend (a raw file, a sparse in-memory disk, a stacked
// layered image), over Unix sockets or TCP.
//
// We write our own server instead of using github.com/pojntfx/go-nbd v0.3.2:
// that server handles one request at a time per connection (read request,
// serve, reply, repeat) and has no TRIM/WRITE_ZEROES/FUA, so a client with a
// queue depth of 32 gets the latency of a depth of 1. Here each connection
// has one reader that parses requests and a bounded set of goroutines that
// serve them, and replies go out in completion order (the protocol allows it).
package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire constants from the NBD protocol document (doc/proto.md in the NBD project).
const (
	magicNBD         uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	magicOpts        uint64 = 0x49484156454f5054 // "IHAVEOPT"
	magicOptReply    uint64 = 0x0003e889045565a9
	magicRequest     uint32 = 0x25609513
	magicSimpleReply uint32 = 0x67446698

	// handshake flags (server) and client flags
	flagFixedNewstyle  uint16 = 1 << 0
	flagNoZeroes       uint16 = 1 << 1
	cflagFixedNewstyle uint32 = 1 << 0
	cflagNoZeroes      uint32 = 1 << 1

	// options
	optExportName   uint32 = 1
	optAbort        uint32 = 2
	optList         uint32 = 3
	optStartTLS     uint32 = 5
	optInfo         uint32 = 6
	optGo           uint32 = 7
	optStructured   uint32 = 8
	optListMetaCtx  uint32 = 9
	optSetMetaCtx   uint32 = 10
	optExtendedHdrs uint32 = 11

	// option reply types
	repAck         uint32 = 1
	repServer      uint32 = 2
	repInfo        uint32 = 3
	repErrUnsup    uint32 = 1<<31 + 1
	repErrPolicy   uint32 = 1<<31 + 2
	repErrInvalid  uint32 = 1<<31 + 3
	repErrUnknown  uint32 = 1<<31 + 6
	repErrShutdown uint32 = 1<<31 + 7

	// info types in NBD_OPT_INFO / NBD_OPT_GO
	infoExport      uint16 = 0
	infoName        uint16 = 1
	infoDescription uint16 = 2
	infoBlockSize   uint16 = 3

	// transmission flags
	tflagHasFlags      uint16 = 1 << 0
	tflagReadOnly      uint16 = 1 << 1
	tflagSendFlush     uint16 = 1 << 2
	tflagSendFUA       uint16 = 1 << 3
	tflagSendTrim      uint16 = 1 << 5
	tflagSendWriteZero uint16 = 1 << 6
	tflagCanMultiConn  uint16 = 1 << 8

	// commands
	cmdRead        uint16 = 0
	cmdWrite       uint16 = 1
	cmdDisc        uint16 = 2
	cmdFlush       uint16 = 3
	cmdTrim        uint16 = 4
	cmdCache       uint16 = 5
	cmdWriteZeroes uint16 = 6

	// command flags
	cmdFlagFUA    uint16 = 1 << 0
	cmdFlagNoHole uint16 = 1 << 1

	// errors carried in simple replies (Linux errno values, as the protocol fixes them)
	errPerm     uint32 = 1
	errIO       uint32 = 5
	errNoMem    uint32 = 12
	errInval    uint32 = 22
	errNoSpc    uint32 = 28
	errOverflow uint32 = 75
	errNotSup   uint32 = 95
	errShutdown uint32 = 108
)

// Sizes of fixed wire structures.
const (
	requestLen     = 28
	simpleReplyLen = 16
	optHeaderLen   = 16
	optReplyHdrLen = 20
)

// Limits that keep a hostile client from making us allocate or wait without bound.
const (
	// maxOptionLen caps the payload of one handshake option. Export names are
	// at most 4096 bytes by the protocol; the rest is a small list of info requests.
	maxOptionLen = 8 << 10
	// maxOptions caps how many options one client may send before GO.
	maxOptions = 64
	// DefaultMaxPayload is the largest READ/WRITE we accept (advertised as the
	// maximum block size); larger requests are refused or end the connection.
	DefaultMaxPayload = 32 << 20
)

var (
	errBadMagic      = errors.New("bad magic")
	errShortHeader   = errors.New("short header")
	errOptionTooLong = errors.New("option payload too long")
)

// request is one parsed transmission-phase request header.
type request struct {
	flags  uint16
	typ    uint16
	handle uint64
	offset uint64
	length uint32
}

// parseRequest decodes a 28-byte request header.
func parseRequest(b []byte) (request, error) {
	if len(b) < requestLen {
		return request{}, errShortHeader
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != magicRequest {
		return request{}, fmt.Errorf("request: %w %#x", errBadMagic, m)
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:6]),
		typ:    binary.BigEndian.Uint16(b[6:8]),
		handle: binary.BigEndian.Uint64(b[8:16]),
		offset: binary.BigEndian.Uint64(b[16:24]),
		length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

// putRequest encodes a request header into b (at least requestLen bytes).
func putRequest(b []byte, r request) {
	binary.BigEndian.PutUint32(b[0:4], magicRequest)
	binary.BigEndian.PutUint16(b[4:6], r.flags)
	binary.BigEndian.PutUint16(b[6:8], r.typ)
	binary.BigEndian.PutUint64(b[8:16], r.handle)
	binary.BigEndian.PutUint64(b[16:24], r.offset)
	binary.BigEndian.PutUint32(b[24:28], r.length)
}

// putSimpleReply encodes a simple reply header into b (at least simpleReplyLen bytes).
func putSimpleReply(b []byte, errno uint32, handle uint64) {
	binary.BigEndian.PutUint32(b[0:4], magicSimpleReply)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], handle)
}

// optionHeader is the fixed part of a client option.
type optionHeader struct {
	option uint32
	length uint32
}

func parseOptionHeader(b []byte) (optionHeader, error) {
	if len(b) < optHeaderLen {
		return optionHeader{}, errShortHeader
	}
	if m := binary.BigEndian.Uint64(b[0:8]); m != magicOpts {
		return optionHeader{}, fmt.Errorf("option: %w %#x", errBadMagic, m)
	}
	h := optionHeader{option: binary.BigEndian.Uint32(b[8:12]), length: binary.BigEndian.Uint32(b[12:16])}
	if h.length > maxOptionLen {
		return h, fmt.Errorf("option %d: %w (%d bytes)", h.option, errOptionTooLong, h.length)
	}
	return h, nil
}

// infoRequest is the payload of NBD_OPT_INFO and NBD_OPT_GO.
type infoRequest struct {
	name  string
	infos []uint16
}

// parseInfoRequest decodes: u32 name length, name, u16 count, count x u16 info type.
func parseInfoRequest(b []byte) (infoRequest, error) {
	if len(b) < 6 {
		return infoRequest{}, errors.New("info request: too short")
	}
	n := binary.BigEndian.Uint32(b[0:4])
	if uint64(n) > uint64(len(b)-6) {
		return infoRequest{}, fmt.Errorf("info request: name length %d exceeds payload", n)
	}
	name := string(b[4 : 4+n])
	rest := b[4+n:]
	count := int(binary.BigEndian.Uint16(rest[0:2]))
	rest = rest[2:]
	if len(rest) != 2*count {
		return infoRequest{}, fmt.Errorf("info request: %d info types need %d bytes, have %d", count, 2*count, len(rest))
	}
	infos := make([]uint16, count)
	for i := range infos {
		infos[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return infoRequest{name: name, infos: infos}, nil
}

// appendInfoRequest encodes an info request (client side).
func appendInfoRequest(b []byte, name string, infos ...uint16) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}
