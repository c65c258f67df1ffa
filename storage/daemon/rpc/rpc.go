// Package rpc owns the wire protocol between aenv-storaged and its clients:
// frames of a 4-byte big-endian length followed by one JSON document, over a
// Unix stream socket. A client sends Requests, each with an ID unique among
// its outstanding requests on the connection, and the daemon answers each
// with a Response carrying the same ID. Requests of one connection run
// concurrently (bounded per connection), so responses may come out of order:
// a slow restack does not hold up a create sent after it. Nothing orders two
// requests in flight at once: a client that needs one to follow another
// waits for the first answer.
// The types here are the whole API, shared by the daemon and its Go client.
//
// # Errors
//
// A failed call carries an Error whose Code is one of a small vocabulary,
// and each code has a sentinel that errors.Is matches (through Unwrap):
//
//	code           sentinel         meaning                                        HTTP
//	not_found      ErrNotFound      no such device, holder                         404
//	conflict       ErrConflict      the device's state forbids it (shared, read-   409
//	                                only, layer path taken, lost device)
//	capacity       ErrCapacity      out of a resource: no free device id; also     503 + Retry-After
//	                                shutting_down (retry on the restarted daemon)
//	invalid        ErrInvalid       bad parameters only (missing image, bad size)  400
//	internal       ErrInternal      anything else: I/O errors, a failed export     500
//
// The codes lost and shutting_down are kept for clients that look at Code;
// they match ErrConflict and ErrCapacity respectively (and ErrLost,
// ErrShuttingDown). The daemon never labels an internal failure invalid.
package rpc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxFrame bounds one frame, so a hostile or broken peer cannot make us
// allocate without limit. The largest legitimate message (a device list) is
// far below it.
const MaxFrame = 4 << 20

// ProtocolVersion changes when a message changes incompatibly.
const ProtocolVersion = 1

// Method names.
const (
	MethodCreate        = "create"
	MethodDelete        = "delete"
	MethodRestack       = "restack"
	MethodLocalize      = "localize"
	MethodAcquireShared = "acquire_shared"
	MethodReleaseShared = "release_shared"
	MethodList          = "list"
	MethodReclaim       = "reclaim"
	MethodAssign        = "assign"
	MethodRebase        = "rebase"
	MethodWarm          = "warm"
	MethodPrefetch      = "prefetch"
	MethodFeatures      = "features"
	MethodShutdown      = "shutdown"
)

// Error codes (see the package doc for what each means).
const (
	CodeInvalid      = "invalid"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeCapacity     = "capacity"
	CodeLost         = "lost"          // a conflict: the device exists but is not servable
	CodeShuttingDown = "shutting_down" // a capacity error: retry once the daemon is back
	CodeInternal     = "internal"
)

// Sentinels matched with errors.Is against any error a call returns, over
// RPC or in process.
var (
	ErrNotFound     = errors.New("storaged: not found")
	ErrConflict     = errors.New("storaged: conflict")
	ErrCapacity     = errors.New("storaged: out of capacity")
	ErrInvalid      = errors.New("storaged: invalid request")
	ErrInternal     = errors.New("storaged: internal error")
	ErrLost         = fmt.Errorf("storaged: device lost: %w", ErrConflict)
	ErrShuttingDown = fmt.Errorf("storaged: shutting down: %w", ErrCapacity)
)

// sentinel returns the sentinel of a code; unknown codes (a newer daemon)
// are internal errors.
func sentinel(code string) error {
	switch code {
	case CodeNotFound:
		return ErrNotFound
	case CodeConflict:
		return ErrConflict
	case CodeCapacity:
		return ErrCapacity
	case CodeInvalid:
		return ErrInvalid
	case CodeLost:
		return ErrLost
	case CodeShuttingDown:
		return ErrShuttingDown
	default:
		return ErrInternal
	}
}

// ErrFrameTooLarge is returned for frames above MaxFrame.
var ErrFrameTooLarge = errors.New("rpc frame too large")

// Request is one call.
type Request struct {
	ID     uint64          `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Response answers the Request with the same ID: Result or Error.
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Error is a failed call.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("storaged: %s: %s", e.Code, e.Message) }

// Is lets errors.Is match on the code alone: errors.Is(err, &rpc.Error{Code: rpc.CodeNotFound}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap returns the sentinel of the code, so errors.Is(err, rpc.ErrNotFound) works.
func (e *Error) Unwrap() error { return sentinel(e.Code) }

// Device kinds.
const (
	KindRuntime = "runtime" // a per-VM device with its own writable upper (or read-only)
	KindShared  = "shared"  // one read-only export per image, reference counted by holders
	KindPool    = "pool"    // a ready runtime device waiting in the warm pool
)

// Device states.
const (
	StateActive = "active"
	StateLost   = "lost" // found in the state directory but not servable; see LostReason
)

// Device describes one block export.
type Device struct {
	ID       uint32 `json:"id"`
	Kind     string `json:"kind"`
	State    string `json:"state"`
	Owner    string `json:"owner,omitempty"`
	Image    string `json:"image"`  // the source image config
	Config   string `json:"config"` // the runtime image config the export serves
	ReadOnly bool   `json:"read_only"`
	Size     int64  `json:"size"`
	// Socket is the Unix socket of the NBD export; Export is its name.
	Socket string `json:"socket"`
	Export string `json:"export"`
	// URI is the NBD URI QEMU and libnbd accept (nbd+unix:///EXPORT?socket=SOCKET).
	URI string `json:"uri"`
	// TCP is the loopback TCP address of the export, when requested.
	TCP string `json:"tcp,omitempty"`
	// BlockDevice is the kernel block device (/dev/nbdN or /dev/ublkbN),
	// when requested; Block says which kind.
	BlockDevice string   `json:"block_device,omitempty"`
	Block       string   `json:"block,omitempty"`
	Holders     []string `json:"holders,omitempty"`
	Layers      []string `json:"layers,omitempty"` // sealed layers, bottom first
	LostReason  string   `json:"lost_reason,omitempty"`
}

// CreateParams asks for a runtime device from an image config.
type CreateParams struct {
	// Image is the path of an image config (storage/image JSON) whose lowers
	// the device stacks on; it must have no upper.
	Image string `json:"image"`
	// ReadOnly exports the lowers without an upper.
	ReadOnly bool `json:"read_only,omitempty"`
	// Size is the virtual size in bytes (a multiple of 512); 0 takes the image's.
	Size int64 `json:"size,omitempty"`
	// Owner tags the device for Reclaim (e.g. the sandbox id).
	Owner string `json:"owner,omitempty"`
	// TCP also exports the device on a loopback TCP port.
	TCP bool `json:"tcp,omitempty"`
	// Kernel also attaches the export to the kernel NBD driver (/dev/nbdN);
	// see Features.KernelNBD. It is Block "nbd" under its older name.
	Kernel bool `json:"kernel,omitempty"`
	// Block also exports the device as a kernel block device of this kind:
	// BlockNBD (/dev/nbdN) or BlockUblk (/dev/ublkbN); see Features and
	// ChooseBlock.
	Block string `json:"block,omitempty"`
	// ConnectAs is the identity of the one unprivileged process (a confined
	// VMM) that may connect to the device's socket besides root: the
	// socket is made its own, mode 0600, again after every restart of the
	// daemon. Nil: root only.
	ConnectAs *Identity `json:"connect_as,omitempty"`
}

// Identity is a uid and gid.
type Identity struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// IDParams names a device.
type IDParams struct {
	ID uint32 `json:"id"`
}

// RestackParams seals a device's live upper into a new layer.
type RestackParams struct {
	ID uint32 `json:"id"`
	// Layer is the absolute path to write the sealed layer to (it must not
	// exist); empty: inside the device's state directory.
	Layer   string `json:"layer,omitempty"`
	Message string `json:"message,omitempty"`
	// Keep leaves the device on its upper: the sealed layer is a copy of it
	// and the device goes on unchanged, with no new generation to write
	// and open. For a caller about to delete the device (a pause, a build's
	// commit), or whose VM may go on writing if what follows fails.
	Keep bool `json:"keep,omitempty"`
}

// RestackResult describes the sealed layer; without Keep the device
// continues on a fresh upper stacked on it.
type RestackResult struct {
	Layer  string `json:"layer"`
	Digest string `json:"digest"` // sha256:<hex> of the layer file
	Size   int64  `json:"size"`   // bytes of the layer file
	// Layers is the stack the sealed layer completes: the device's lowers
	// with Layer on top.
	Layers []string `json:"layers"`
	Device Device   `json:"device"`
}

// LocalizeParams moves lowers a device reads from URLs onto local files
// that hold the same bytes, under its live export (the guest notices
// nothing): a node reads a layer it has not fetched yet through a URL,
// fetches it whole in the background, and then stops depending on the
// remote end.
type LocalizeParams struct {
	ID     uint32       `json:"id"`
	Lowers []LocalLower `json:"lowers"`
}

// LocalLower pairs a lower's URL with its local copy. The URL must name
// the layer's sha256 in its path (a content-addressed URL: ".../sha256/<hex>"
// or ".../sha256:<hex>"), and the file, an absolute path, must have that
// digest. A URL the device does not read from is skipped (a retry after
// the move).
type LocalLower struct {
	URL  string `json:"url"`
	File string `json:"file"`
}

// AcquireParams takes a reference on the shared read-only device of an image.
type AcquireParams struct {
	Image  string `json:"image"`
	Holder string `json:"holder"`
	// Kernel attaches the shared export to /dev/nbdN when the device is first
	// created (a VMM maps memory from a block device path); later acquires
	// get the same device whatever they ask.
	Kernel bool `json:"kernel,omitempty"`
	// Block is the kind of kernel block device, as in CreateParams.
	Block string `json:"block,omitempty"`
}

// PrefetchParams pushes byte ranges of a shared device exported as a FUSE
// file into the kernel's page cache (FUSE_NOTIFY_STORE), so faults on them
// need no FUSE read: the recorded working set of a memory stack, ahead of
// the guest. At most MaxPrefetchRanges ranges. With Pack (an absolute
// path to a working-set pack of the device's stack, package memsnap's
// format, and no ranges), the pack's bytes are stored instead, without
// reading the device: the caller vouches for them (the pack is committed
// with the stack's layers).
type PrefetchParams struct {
	ID     uint32      `json:"id"`
	Ranges []ByteRange `json:"ranges"`
	Pack   string      `json:"pack,omitempty"`
}

// ByteRange is a byte range of a device.
type ByteRange struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// MaxPrefetchRanges bounds one Prefetch call.
const MaxPrefetchRanges = 1 << 16

// PrefetchResult says how many bytes went into the page cache (ranges
// widened to whole pages, clipped to the device).
type PrefetchResult struct {
	Stored int64 `json:"stored"`
}

// ReleaseParams drops a holder's reference; the export goes away with the last one.
type ReleaseParams struct {
	ID     uint32 `json:"id"`
	Holder string `json:"holder"`
}

// ReclaimParams deletes an owner's runtime devices and drops its shared
// references, except the listed devices. aenvd calls it after a restart with
// the devices it still knows about.
type ReclaimParams struct {
	Owner string   `json:"owner"`
	Keep  []uint32 `json:"keep,omitempty"`
}

// AssignParams hands a runtime device to another owner (a VM started ahead
// for a pool becomes a sandbox's): Reclaim and the node's recovery then
// treat it as the new owner's.
type AssignParams struct {
	ID    uint32 `json:"id"`
	Owner string `json:"owner"`
}

// RebaseParams moves a runtime device that was never written onto the
// lowers of another image config, under its live export: a VMM started
// ahead for a pool, its disk on a template's layers, is handed to a resume
// or a fork child whose disk stacks on other layers. Refused (conflict) for
// a device anything was written to, or one the kernel exports as a block
// device (its page cache may hold blocks of the old image); refused
// (invalid) for an image of another size.
type RebaseParams struct {
	ID    uint32 `json:"id"`
	Image string `json:"image"`
}

// ReclaimResult lists what was reclaimed.
type ReclaimResult struct {
	Deleted  []uint32 `json:"deleted,omitempty"`
	Released []uint32 `json:"released,omitempty"`
}

// WarmParams registers an image shape with the warm pool and fills it in the background.
type WarmParams struct {
	Image string `json:"image"`
	Size  int64  `json:"size,omitempty"`
	// Low and High are the watermarks: refill starts below Low and stops at
	// High; zero takes the daemon's defaults.
	Low  int `json:"low,omitempty"`
	High int `json:"high,omitempty"`
}

// ListResult lists every device, lost ones included.
type ListResult struct {
	Devices []Device `json:"devices"`
}

// Features says what this daemon can do.
type Features struct {
	ProtocolVersion int      `json:"protocol_version"`
	Exports         []string `json:"exports"` // "nbd", and "ublk" where the driver is loaded
	Restack         bool     `json:"restack"`
	// Localize says whether URL lowers can move onto local files (LocalizeParams).
	Localize      bool `json:"localize"`
	SharedDevices bool `json:"shared_devices"`
	WarmPool      bool `json:"warm_pool"`
	Assign        bool `json:"assign"`
	Rebase        bool `json:"rebase"`
	Resize        bool `json:"resize"`
	TCP           bool `json:"tcp"`
	// KernelNBD says whether devices can be attached to /dev/nbdN here.
	KernelNBD bool `json:"kernel_nbd"`
	// Ublk says whether devices can be exported as /dev/ublkbN here.
	Ublk bool `json:"ublk"`
	// SharedBlock is how this daemon exports shared read-only devices to
	// be mapped as memory, chosen once at its start: BlockUblk, BlockFUSE,
	// or empty (neither). Acquire with another kind is refused.
	SharedBlock string `json:"shared_block,omitempty"`
}

// WriteFrame encodes v as one frame.
func WriteFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode rpc frame: %w", err)
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("encode rpc frame of %d bytes: %w", len(b), ErrFrameTooLarge)
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// ReadFrame reads one frame into v. io.EOF means the peer closed cleanly
// between frames.
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return fmt.Errorf("read rpc frame of %d bytes: %w", n, ErrFrameTooLarge)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("read rpc frame: %w", io.ErrUnexpectedEOF)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode rpc frame: %w", err)
	}
	return nil
}

// Kernel block device kinds (CreateParams.Block, Device.Block).
const (
	BlockNone = ""     // no kernel device: NBD over the Unix socket only
	BlockNBD  = "nbd"  // the kernel NBD driver, /dev/nbdN
	BlockUblk = "ublk" // the ublk driver, /dev/ublkbN
	// BlockFUSE is a read-only file on the daemon's FUSE mount (package
	// memfs), for shared read-only devices a VMM maps as memory; the
	// device's BlockDevice is the file's path.
	BlockFUSE = "fuse"
)

// SharedFileDir is the directory, in the daemon's run directory, of its
// FUSE mount of shared memory files; each file is named by its export
// (ExportPrefix, then the device id and a nonce).
const (
	SharedFileDir = "mem"
	ExportPrefix  = "aenv-"
)

// BlockKind returns the kernel block device kind p asks for: Block, or
// BlockNBD for the older Kernel flag. It rejects unknown kinds.
func BlockKind(block string, kernel bool) (string, error) {
	switch block {
	case BlockNone:
		if kernel {
			return BlockNBD, nil
		}
		return BlockNone, nil
	case BlockNBD, BlockUblk, BlockFUSE:
		if kernel && block != BlockNBD {
			return "", fmt.Errorf("block %q contradicts kernel (nbd)", block)
		}
		return block, nil
	}
	return "", fmt.Errorf("unknown block device kind %q (want %q, %q or %q)", block, BlockNBD, BlockUblk, BlockFUSE)
}

// ChooseBlock is how a node picks the transport of a VM's disk from what
// its storage daemon can do and whether its VMM speaks NBD itself: ublk
// where the driver is loaded (no network protocol between the kernel and
// the daemon, and with user recovery the device outlives a restart of the
// daemon); else, for a VMM with its own NBD client (QEMU), BlockNone: NBD
// over the Unix socket, which that client reconnects after a restart of the
// daemon; else the kernel NBD driver (its connections are socket pairs to
// the daemon and end with it), or BlockNone where there is none.
func ChooseBlock(f Features, vmmSpeaksNBD bool) string {
	switch {
	case f.Ublk:
		return BlockUblk
	case f.KernelNBD && !vmmSpeaksNBD:
		return BlockNBD
	}
	return BlockNone
}
