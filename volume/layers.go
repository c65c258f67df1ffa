package volume

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/image"
)

// guestUserOwner owns a new volume's root directory: E2B's default user
// (uid and gid 1000 in the base image, guest/image), so the SDK's file
// writes, which run as that user, may create files in the mount.
const guestUserOwner = "1000:1000"

// FormatExt4 is the Formatter of a node: mke2fs formats the blank
// filesystem inside the layer file, which is sealed around it in place
// (storage/image.BuildRaw), with a journal so a sandbox killed mid-write
// leaves a filesystem the next mount recovers, and no blocks reserved for
// root (the volume is its users' data).
func FormatExt4(ctx context.Context, base string, size int64) error {
	write := func(ctx context.Context, path string, off int64) error {
		ext := "root_owner=" + guestUserOwner
		if off > 0 {
			ext += ",offset=" + strconv.FormatInt(off, 10)
		}
		args := []string{"-q", "-F", "-t", "ext4", "-L", "aenv-volume", "-b", "4096", "-m", "0", "-E", ext, path, strconv.FormatInt(size>>10, 10) + "k"}
		if out, err := exec.CommandContext(ctx, "mke2fs", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("mke2fs %s: %w: %s", path, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if _, err := image.BuildRaw(ctx, base+".lsmt", size, image.CommitOptions{Message: "blank volume"}, write); err != nil {
		return fmt.Errorf("format volume: %w", err)
	}
	return snapshot.WriteImageConfig(base+".json", []string{base + ".lsmt"})
}
