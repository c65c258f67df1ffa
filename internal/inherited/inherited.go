// Package inherited keeps descriptors a process was started with from
// reaching its own children. Go opens every descriptor of its own with
// close-on-exec, but one inherited from the parent (a shell's or a CI
// runner's pipe) is not, so a daemon would hand it on to every VMM and
// helper it starts: a VMM must hold only the files it is given.
package inherited

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// CloseOnExec marks every descriptor above stderr close-on-exec: they stay
// usable here, and no child gets them unless it is handed them explicitly
// (exec.Cmd.ExtraFiles). Call it first thing in main.
func CloseOnExec() error {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	return nil
}
