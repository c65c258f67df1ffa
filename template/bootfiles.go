package template

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
)

// Names of the boot files a template keeps in its directory: the VM
// snapshot's configuration and a cold boot of its sandboxes name them.
const (
	KernelFile = "vmlinuz"
	InitrdFile = "initrd.cpio"
)

// fpBootFilesSynced: the kernel and initrd copies and their directory
// entries are durable; no VM booted them and no record names them yet.
var fpBootFilesSynced = failpoint.New("template/boot/synced")

// CopyBootFiles copies a kernel and an initrd into dir (KernelFile,
// InitrdFile) and fsyncs both, dir and dir's parent, so that a record written afterwards
// (the template's snapshot configuration, its store record) never names a
// boot file that a power loss left empty or short.
func CopyBootFiles(ctx context.Context, dir, kernelSrc, initrdSrc string) (kernel, initrd string, err error) {
	kernel, initrd = filepath.Join(dir, KernelFile), filepath.Join(dir, InitrdFile)
	for _, c := range [][2]string{{kernelSrc, kernel}, {initrdSrc, initrd}} {
		if err := snapshot.SparseCopy(ctx, c[0], c[1]); err != nil {
			return "", "", fmt.Errorf("copy boot files to %s: %w", dir, err)
		}
		if err := atomicfile.SyncFile(c[1]); err != nil {
			return "", "", fmt.Errorf("copy boot files to %s: %w", dir, err)
		}
	}
	if err := atomicfile.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil { // dir's own entry
		return "", "", fmt.Errorf("copy boot files to %s: %w", dir, err)
	}
	if err := fpBootFilesSynced.Inject(); err != nil {
		return "", "", fmt.Errorf("copy boot files to %s: %w", dir, err)
	}
	return kernel, initrd, nil
}
