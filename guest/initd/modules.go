package initd

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// moduleInitCompressedFile is MODULE_INIT_COMPRESSED_FILE from
// <linux/module.h>: the kernel decompresses the module itself.
const moduleInitCompressedFile = 4

// loadModules loads, in order, the modules named in list (one path per line,
// relative to the list's directory, dependencies first). It needs no
// userspace tools: finit_module takes the file directly.
func loadModules(log *slog.Logger, list string) error {
	f, err := os.Open(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open module list: %w", err)
	}
	defer f.Close()
	dir := filepath.Dir(list)
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := loadModule(filepath.Join(dir, line)); err != nil {
			return err
		}
		n++
	}
	log.Info("modules loaded", "count", n)
	return sc.Err()
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	defer f.Close()
	flags := 0
	if strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".zst") || strings.HasSuffix(path, ".gz") {
		flags |= moduleInitCompressedFile
	}
	err = unix.FinitModule(int(f.Fd()), "", flags)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}
