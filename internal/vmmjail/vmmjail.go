// Package vmmjail starts a VMM in a mount namespace that holds only what the
// VMM needs (and, when asked, in a network namespace of its own holding
// nothing but a loopback device that is down), in the manner of Firecracker's jailer: a read-only tmpfs root
// with the system's program directories (/usr and the /lib, /bin links),
// a fresh /proc, a few device nodes, and the files and directories the caller
// names, bound at the paths they have on the host. Nothing else of the host
// (the node's data directory, other sandboxes' files, /home, /var, /etc) is
// in that namespace at all, so a VMM taken over by its guest finds nothing
// to open even before it drops privileges and chroots itself.
//
// Go cannot run code between fork and exec, so the jail is built by this very
// executable, started again (/proc/self/exe) with the jail's description in
// its environment: this package's init sees it, builds the tree in the new
// mount namespace, pivots into it and execs the VMM, so the process keeps the
// VMM's pid. Every binary that imports the package can start jailed VMMs; the
// init does nothing in any other process. No well-kept library served here
// does this (runc's is a whole container runtime, with cgo).
package vmmjail

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// envKey carries the JSON Spec to the re-executed helper.
const envKey = "AENV_VMM_JAIL"

// helperName is argv[0] of the helper while it builds the jail (ps shows
// it for those few milliseconds); the VMM's own argv replaces it at exec.
const helperName = "aenv-vmm-jail"

// Spec describes one jailed start.
type Spec struct {
	Path  string   `json:"path"` // the VMM binary (inside a bound directory or bound itself)
	Args  []string `json:"args"` // its argv, argv[0] included
	Env   []string `json:"env"`
	Dir   string   `json:"dir"`   // its working directory in the jail (bound)
	Binds []Bind   `json:"binds"` // host paths it needs, besides the system's
	// OwnNetwork starts the VMM in a new network namespace: it reaches no
	// address, listener or interface of the host's (the API, the proxy, the
	// LAN, cloud metadata), only what it was handed as descriptors (its
	// taps, whose devices stay in their own namespaces) and Unix sockets
	// by path.
	OwnNetwork bool `json:"own_network,omitempty"`
}

// Bind is a host path visible in the jail at the same path: a directory, a
// regular file or a device node.
type Bind struct {
	Path     string `json:"path"`
	Writable bool   `json:"writable,omitempty"`
}

// Command returns the command that starts s in a jail. The caller sets
// stdio, ExtraFiles and SysProcAttr as for the VMM itself. The helper makes
// its own mount namespace (private), so nothing it mounts reaches the host.
func Command(s Spec) (*exec.Cmd, error) {
	if !filepath.IsAbs(s.Path) || !filepath.IsAbs(s.Dir) {
		return nil, fmt.Errorf("vmm jail: binary %q and working directory %q must be absolute", s.Path, s.Dir)
	}
	for _, b := range s.Binds {
		if !filepath.IsAbs(b.Path) || filepath.Clean(b.Path) != b.Path || b.Path == "/" {
			return nil, fmt.Errorf("vmm jail: bind %q must be a clean absolute path below /", b.Path)
		}
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("vmm jail: %w", err)
	}
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{helperName}}
	cmd.Env = append(withoutKey(os.Environ()), envKey+"="+string(raw))
	return cmd, nil
}

// systemPaths are the host paths every VMM needs to run at all: its
// program and library directories (or the links to them a merged-/usr
// system has) and the dynamic linker's cache. They are always bound.
func systemPaths() []string {
	return []string{"/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache"}
}

// devices are the device nodes a VMM may open (/dev/kvm where it exists).
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/kvm"}

func init() {
	raw, ok := os.LookupEnv(envKey)
	if !ok {
		return
	}
	err := enter(raw)
	// Only a failure returns: the VMM's log (our stderr) says why.
	fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
	os.Exit(126)
}

// enter builds the jail and execs the VMM; it returns only on failure.
func enter(raw string) error {
	var s Spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	// A mount namespace of this thread's own, whatever the starter asked
	// for: the tmpfs below must never cover the host's directory. Every
	// step runs on this one thread (init's goroutine is locked to it), and
	// the exec keeps its namespace.
	runtime.LockOSThread()
	flags := syscall.CLONE_NEWNS
	if s.OwnNetwork {
		flags |= syscall.CLONE_NEWNET
	}
	if err := syscall.Unshare(flags); err != nil {
		return fmt.Errorf("unshare the mount and network namespaces (flags %#x): %w", flags, err)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mount namespace private: %w", err)
	}
	const root = "/tmp" // any directory will do: the sources are open already
	srcs, err := openSources(s.Binds)
	if err != nil {
		return err
	}
	if err := build(root, srcs); err != nil {
		return err
	}
	if err := pivot(root); err != nil {
		return err
	}
	if err := syscall.Chdir(s.Dir); err != nil {
		return fmt.Errorf("chdir %s in the jail: %w", s.Dir, err)
	}
	env := withoutKey(s.Env)
	return fmt.Errorf("exec %s: %w", s.Path, syscall.Exec(s.Path, s.Args, env))
}

// source is a path to show in the jail, opened before anything is mounted
// over it (O_PATH: no access to its content is needed to bind it).
type source struct {
	path     string
	fd       int
	mode     uint32
	link     string // a symbolic link of the system's (merged /usr), copied as a link
	writable bool
}

func openSources(binds []Bind) ([]source, error) {
	var out []source
	for _, p := range systemPaths() {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
			continue // this system has no such directory
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, fmt.Errorf("read link %s: %w", p, err)
			}
			out = append(out, source{path: p, fd: -1, link: target})
			continue
		}
		binds = append(binds, Bind{Path: p})
	}
	for _, d := range devices {
		if _, err := os.Stat(d); err == nil {
			binds = append(binds, Bind{Path: d, Writable: true})
		}
	}
	for _, b := range dedupe(binds) {
		fd, err := syscall.Open(b.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", b.Path, err)
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			return nil, fmt.Errorf("stat %s: %w", b.Path, err)
		}
		out = append(out, source{path: b.Path, fd: fd, mode: st.Mode, writable: b.Writable})
	}
	return out, nil
}

// dedupe sorts binds by path and drops those a bound directory above them
// shows already (a file of /usr, say); a writable one keeps its own mount.
func dedupe(binds []Bind) []Bind {
	sort.Slice(binds, func(i, j int) bool { return binds[i].Path < binds[j].Path })
	var out []Bind
	for _, b := range binds {
		covered := false
		for _, o := range out {
			if (b.Path == o.Path || strings.HasPrefix(b.Path, o.Path+"/")) && (o.Writable || !b.Writable) {
				covered = true
			}
		}
		if !covered {
			out = append(out, b)
		}
	}
	return out
}

// build makes root a small tmpfs holding the sources at their paths, a
// fresh /proc and the mount point the old root goes to.
func build(root string, srcs []source) error {
	if err := syscall.Mount("tmpfs", root, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount the jail's tmpfs: %w", err)
	}
	for _, s := range srcs {
		if err := place(root, s); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(root+"/proc", 0o555); err != nil {
		return fmt.Errorf("jail /proc: %w", err)
	}
	if err := syscall.Mount("proc", root+"/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount the jail's /proc: %w", err)
	}
	return os.Mkdir(root+"/.old", 0o700)
}

// place binds one source into the tree (or copies a link) and makes the
// bind read-only unless it is writable.
func place(root string, s source) error {
	target := root + s.path
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("jail: make the parents of %s: %w", s.path, err)
	}
	if s.link != "" {
		if err := os.Symlink(s.link, target); err != nil {
			return fmt.Errorf("jail: link %s: %w", s.path, err)
		}
		return nil
	}
	if err := mountPoint(target, s.mode&syscall.S_IFMT == syscall.S_IFDIR); err != nil {
		return fmt.Errorf("jail: mount point %s: %w", s.path, err)
	}
	from := fmt.Sprintf("/proc/self/fd/%d", s.fd)
	// Not recursive: what is mounted below a source stays out (the
	// storage daemon's FUSE mount of memory exports lies below the socket
	// directory; a VMM gets its own export as a descriptor).
	if err := syscall.Mount(from, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("jail: bind %s: %w", s.path, err)
	}
	_ = syscall.Close(s.fd)
	flags := uintptr(syscall.MS_REMOUNT | syscall.MS_BIND | syscall.MS_NOSUID)
	if !s.writable {
		flags |= syscall.MS_RDONLY
	}
	if t := s.mode & syscall.S_IFMT; t != syscall.S_IFCHR && t != syscall.S_IFBLK {
		flags |= syscall.MS_NODEV
	}
	if err := syscall.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("jail: remount %s: %w", s.path, err)
	}
	return nil
}

func mountPoint(path string, dir bool) error {
	if dir {
		return os.Mkdir(path, 0o755)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// pivot makes root the namespace's root, lets go of the old one and makes
// the new root read-only.
func pivot(root string) error {
	if err := syscall.PivotRoot(root, root+"/.old"); err != nil {
		return fmt.Errorf("pivot_root into the jail: %w", err)
	}
	if err := syscall.Chdir("/"); err != nil {
		return fmt.Errorf("chdir to the jail's root: %w", err)
	}
	if err := syscall.Unmount("/.old", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := os.Remove("/.old"); err != nil {
		return fmt.Errorf("remove the old root's mount point: %w", err)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make the jail's root read-only: %w", err)
	}
	return nil
}

func withoutKey(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, envKey+"=") {
			out = append(out, kv)
		}
	}
	return out
}
