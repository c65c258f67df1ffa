//go:build linux

package ublk

// The kernel ABI, from include/uapi/linux/ublk_cmd.h and io_uring.h. The
// command numbers are the ioctl-encoded ones (UBLK_F_CMD_IOCTL_ENCODE):
// _IOR/_IOWR('u', nr, struct), the struct being ublksrv_ctrl_cmd (32 bytes)
// for control commands and ublksrv_io_cmd (16 bytes) for I/O commands.

const (
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | 'u'<<8 | nr }

var (
	cmdGetDevInfo        = ioc(iocRead, 0x02, 32)
	cmdAddDev            = ioc(iocRead|iocWrite, 0x04, 32)
	cmdDelDev            = ioc(iocRead|iocWrite, 0x05, 32)
	cmdStartDev          = ioc(iocRead|iocWrite, 0x06, 32)
	cmdStopDev           = ioc(iocRead|iocWrite, 0x07, 32)
	cmdSetParams         = ioc(iocRead|iocWrite, 0x08, 32)
	cmdStartUserRecovery = ioc(iocRead|iocWrite, 0x10, 32)
	cmdEndUserRecovery   = ioc(iocRead|iocWrite, 0x11, 32)
	cmdGetFeatures       = ioc(iocRead, 0x13, 32)

	ioFetchReq          = ioc(iocRead|iocWrite, 0x20, 16)
	ioCommitAndFetchReq = ioc(iocRead|iocWrite, 0x21, 16)
)

// Device flags (ublksrv_ctrl_dev_info.flags).
const (
	flagUserRecovery        = 1 << 3
	flagUserRecoveryReissue = 1 << 4
	flagCmdIoctlEncode      = 1 << 6
	flagUserCopy            = 1 << 7
)

// Device states (ublksrv_ctrl_dev_info.state).
const (
	stateDead     = 0
	stateLive     = 1
	stateQuiesced = 2
)

// I/O results and operations.
const (
	ioResOK    = 0
	ioResAbort = -19 // -ENODEV: the queue is going away

	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteZeroes = 5
)

// Parameter types and basic attributes.
const (
	paramBasic   = 1 << 0
	paramDiscard = 1 << 1

	attrReadOnly      = 1 << 0
	attrVolatileCache = 1 << 2
)

// maxQueueDepth is UBLK_MAX_QUEUE_DEPTH: each queue's descriptor area in
// the char device's mapping is sized for it.
const maxQueueDepth = 4096

// ctrlCmd is struct ublksrv_ctrl_cmd: the payload of a control URING_CMD.
type ctrlCmd struct {
	devID      uint32
	queueID    uint16
	len        uint16
	addr       uint64
	data       uint64
	devPathLen uint16
	pad        uint16
	reserved   uint32
}

// devInfo is struct ublksrv_ctrl_dev_info.
type devInfo struct {
	nrHWQueues   uint16
	queueDepth   uint16
	state        uint16
	pad0         uint16
	maxIOBufSize uint32
	devID        uint32
	serverPID    int32
	pad1         uint32
	flags        uint64
	serverFlags  uint64
	ownerUID     uint32
	ownerGID     uint32
	reserved1    uint64
	reserved2    uint64
}

// params is struct ublk_params up to the discard parameters (the kernel
// takes the length we give).
type params struct {
	len   uint32
	types uint32
	// basic
	attrs            uint32
	logicalBSShift   uint8
	physicalBSShift  uint8
	ioOptShift       uint8
	ioMinShift       uint8
	maxSectors       uint32
	chunkSectors     uint32
	devSectors       uint64
	virtBoundaryMask uint64
	// discard
	discardAlignment      uint32
	discardGranularity    uint32
	maxDiscardSectors     uint32
	maxWriteZeroesSectors uint32
	maxDiscardSegments    uint16
	reserved0             uint16
}

// ioCmd is struct ublksrv_io_cmd: the payload of an I/O URING_CMD.
type ioCmd struct {
	queueID uint16
	tag     uint16
	result  int32
	addr    uint64
}

// ioDesc is struct ublksrv_io_desc, one per tag in the mapped area.
type ioDesc struct {
	opFlags     uint32
	nrSectors   uint32
	startSector uint64
	addr        uint64
}
