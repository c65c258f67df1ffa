package kernellane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/digest"
	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// guestConfig is /lane/config.json, read by laneinit.
type guestConfig struct {
	Modules []string `json:"modules"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
}

// buildInitramfs returns the path of the initramfs for o, building it when
// no cached one has the same contents.
func buildInitramfs(ctx context.Context, o Options, k *kernelpkg.Kernel) (string, error) {
	tmp, err := os.MkdirTemp(o.CacheDir, ".build-")
	if err != nil {
		return "", fmt.Errorf("kernel lane: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := o.Binary
	if bin == "" {
		if bin, err = testBinary(ctx, tmp); err != nil {
			return "", err
		}
	}
	initBin, err := buildInit(ctx, tmp)
	if err != nil {
		return "", err
	}
	mods, err := kernelpkg.ResolveModules(k.ModDir, o.Modules)
	if err != nil {
		return "", err
	}
	files := map[string]string{"init": initBin, "lane/test": bin}
	cfg := guestConfig{Argv: append([]string{"/lane/test", "-test.v", "-test.run", o.Run}, o.Args...),
		Env: append([]string{envGuest + "=1"}, o.Env...), Dir: "/tmp"}
	for _, m := range mods {
		files["lane/modules/"+filepath.Base(m)] = filepath.Join(k.ModDir, m)
		cfg.Modules = append(cfg.Modules, "/lane/modules/"+filepath.Base(m))
	}
	progs := o.Programs
	if o.Fio {
		progs = append([]string{"/usr/bin/fio"}, progs...)
	}
	for _, p := range progs {
		if err := addProgram(ctx, files, p); err != nil {
			return "", err
		}
	}
	for g, h := range o.Files {
		files[strings.TrimPrefix(g, "/")] = h
	}
	cfgJSON, _ := json.Marshal(cfg)
	key, err := contentKey(files, cfgJSON)
	if err != nil {
		return "", err
	}
	out := filepath.Join(o.CacheDir, "initramfs", key+".cpio")
	if _, err := os.Stat(out); err == nil {
		now := time.Now()
		_ = os.Chtimes(out, now, now) // recently used: pruned last
		return out, nil
	}
	entries := []entry{{name: "lane/config.json", mode: typeFile | 0o644, data: cfgJSON}}
	for g, h := range files {
		entries = append(entries, entry{name: g, mode: typeFile | 0o755, source: h})
	}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run"} {
		entries = append(entries, entry{name: d, mode: typeDir | 0o755})
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("kernel lane: %w", err)
	}
	pruneInitramfs(filepath.Dir(out))
	f, err := atomicfile.Create(out, 0o644)
	if err != nil {
		return "", fmt.Errorf("kernel lane: %w", err)
	}
	if err := writeCpio(f, entries); err != nil {
		f.Abort()
		return "", err
	}
	if err := f.Commit(); err != nil {
		return "", fmt.Errorf("kernel lane: write %s: %w", out, err)
	}
	return out, nil
}

// buildInit builds laneinit statically into dir.
func buildInit(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out := filepath.Join(dir, "init")
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-o", out, "github.com/agentenv/agentenv/internal/kernellane/laneinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kernel lane: build laneinit: %w: %s", err, b)
	}
	return out, nil
}

// addProgram adds a dynamically linked program and the libraries ldd
// lists for it (with the loader) at their host paths.
func addProgram(ctx context.Context, files map[string]string, prog string) error {
	if _, err := os.Stat(prog); err != nil {
		return fmt.Errorf("kernel lane: %s missing: %w", prog, err)
	}
	files[strings.TrimPrefix(prog, "/")] = prog
	out, err := exec.CommandContext(ctx, "ldd", prog).Output()
	if err != nil {
		return fmt.Errorf("kernel lane: ldd %s: %w", prog, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0]
		default:
			continue
		}
		files[strings.TrimPrefix(lib, "/")] = lib
	}
	return nil
}

// contentKey hashes every file's guest path and contents and the config.
func contentKey(files map[string]string, cfg []byte) (string, error) {
	names := make([]string, 0, len(files))
	for g := range files {
		names = append(names, g)
	}
	sort.Strings(names)
	h := sha256.New()
	h.Write(cfg)
	for _, g := range names {
		sum, err := digest.File(files[g])
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "\x00%s\x00%s", g, sum)
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// pruneInitramfs keeps the cache small: test binaries change with every
// edit, so old images are rarely asked for again. It drops images unused
// for a day and all but the most recently used few.
func pruneInitramfs(dir string) {
	const keep = 8
	ents, _ := os.ReadDir(dir)
	type img struct {
		name string
		used time.Time
	}
	var imgs []img
	for _, e := range ents {
		if info, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".cpio") {
			imgs = append(imgs, img{e.Name(), info.ModTime()})
		}
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].used.After(imgs[j].used) })
	for i, im := range imgs {
		if i >= keep || time.Since(im.used) > 24*time.Hour {
			_ = os.Remove(filepath.Join(dir, im.name))
		}
	}
}

// isNoKernel reports a missing kernel package.
func isNoKernel(err error) bool { return errors.Is(err, ErrNoKernel) }
