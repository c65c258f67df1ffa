//go:build linux

package ublk

import (
	"testing"
	"unsafe"
)

// TestABI pins the layouts and command numbers to include/uapi/linux/ublk_cmd.h:
// a mismatch makes the driver reject or misread every command.
func TestABI(t *testing.T) {
	var p params
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"ublksrv_ctrl_cmd", unsafe.Sizeof(ctrlCmd{}), 32},
		{"ublksrv_ctrl_dev_info", unsafe.Sizeof(devInfo{}), 64},
		{"ublksrv_io_cmd", unsafe.Sizeof(ioCmd{}), 16},
		{"ublksrv_io_desc", unsafe.Sizeof(ioDesc{}), 24},
		{"ublk_params up to discard", unsafe.Offsetof(p.reserved0) + 2, 8 + 32 + 20},
		{"ublk_params.basic.dev_sectors", unsafe.Offsetof(p.devSectors), 8 + 16},
		{"ublk_params.discard", unsafe.Offsetof(p.discardAlignment), 8 + 32},
		{"ctrl_cmd.data", unsafe.Offsetof(ctrlCmd{}.data), 16},
		{"dev_info.flags", unsafe.Offsetof(devInfo{}.flags), 24},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", cmdGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", cmdAddDev, 0xc0207504},
		{"UBLK_U_CMD_END_USER_RECOVERY", cmdEndUserRecovery, 0xc0207511},
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetchReq, 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
