package memfs

import (
	"encoding/binary"
)

// The part of the FUSE wire protocol this package speaks (the kernel's
// include/uapi/linux/fuse.h, protocol 7.x). Every message is a fixed
// little-endian header, a fixed per-operation struct and, for some, a name
// or data; the structs are encoded by hand at the offsets the header
// defines.

const (
	protoMajor = 7
	// protoMinor is the newest minor this server knows: 7.40 added
	// FUSE_NOTIFY_RESEND, which adoption relies on.
	protoMinor = 40
	rootID     = 1
)

// Operation codes (enum fuse_opcode).
const (
	opLookup       = 1
	opForget       = 2
	opGetattr      = 3
	opSetattr      = 4
	opMknod        = 8
	opMkdir        = 9
	opUnlink       = 10
	opRmdir        = 11
	opRename       = 12
	opLink         = 13
	opOpen         = 14
	opRead         = 15
	opWrite        = 16
	opStatfs       = 17
	opRelease      = 18
	opFsync        = 20
	opSetxattr     = 21
	opGetxattr     = 22
	opListxattr    = 23
	opRemovexattr  = 24
	opFlush        = 25
	opInit         = 26
	opOpendir      = 27
	opReaddir      = 28
	opReleasedir   = 29
	opFsyncdir     = 30
	opCreate       = 35
	opInterrupt    = 36
	opDestroy      = 38
	opBatchForget  = 42
	opFallocate    = 43
	opRename2      = 45
	opCopyFileRng  = 47
	opSymlink      = 6
	opTmpfile      = 51
	notifyDelete   = 6
	notifyStore    = 4
	notifyResend   = 7
	uniqueResent   = uint64(1) << 63 // FUSE_UNIQUE_RESEND: set on a resent request's unique
	inHeaderSize   = 40
	outHeaderSize  = 16
	attrSize       = 88
	entryOutSize   = 40 + attrSize
	attrOutSize    = 16 + attrSize
	openOutSize    = 16
	initOutSize    = 64
	statfsOutSize  = 80
	direntBaseSize = 24
)

// INIT flags (fuse_init_in/out.flags).
const (
	initAsyncRead         = 1 << 0
	initAtomicOTrunc      = 1 << 3
	initBigWrites         = 1 << 5
	initMaxPages          = 1 << 22
	initExplicitInvalData = 1 << 25
)

// FOPEN_KEEP_CACHE: the kernel keeps the file's cached pages on open.
const fopenKeepCache = 1 << 1

var le = binary.LittleEndian

// inHeader is fuse_in_header.
type inHeader struct {
	len    uint32
	opcode uint32
	unique uint64
	nodeid uint64
	uid    uint32
	gid    uint32
	pid    uint32
}

func parseInHeader(b []byte) (inHeader, bool) {
	if len(b) < inHeaderSize {
		return inHeader{}, false
	}
	return inHeader{
		len: le.Uint32(b[0:]), opcode: le.Uint32(b[4:]), unique: le.Uint64(b[8:]),
		nodeid: le.Uint64(b[16:]), uid: le.Uint32(b[24:]), gid: le.Uint32(b[28:]), pid: le.Uint32(b[32:]),
	}, true
}

// putOutHeader writes fuse_out_header: total length, negative errno (or a
// notification code when unique is 0) and the request's unique.
func putOutHeader(b []byte, n int, errno int32, unique uint64) {
	le.PutUint32(b[0:], uint32(n))
	le.PutUint32(b[4:], uint32(errno))
	le.PutUint64(b[8:], unique)
}

// attr is fuse_attr.
type attr struct {
	ino, size, blocks uint64
	time              uint64 // atime, mtime and ctime alike
	mode, nlink       uint32
	uid, gid          uint32
	blksize           uint32
}

func (a *attr) put(b []byte) {
	le.PutUint64(b[0:], a.ino)
	le.PutUint64(b[8:], a.size)
	le.PutUint64(b[16:], a.blocks)
	le.PutUint64(b[24:], a.time)
	le.PutUint64(b[32:], a.time)
	le.PutUint64(b[40:], a.time)
	// [48:60] nanoseconds stay 0
	le.PutUint32(b[60:], a.mode)
	le.PutUint32(b[64:], a.nlink)
	le.PutUint32(b[68:], a.uid)
	le.PutUint32(b[72:], a.gid)
	// [76:80] rdev 0
	le.PutUint32(b[80:], a.blksize)
	// [84:88] flags 0
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
