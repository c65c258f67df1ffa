// Package cgroup confines processes (a sandbox's VMM) in a control group of
// their own with cpu, memory and pids limits. It works on cgroup v2 (one
// unified hierarchy) and on v1 (one hierarchy per controller, as hosts with
// a hybrid layout still mount them), choosing per controller what the host
// offers: v2 when the unified hierarchy has the controller, else the v1
// hierarchy of that controller.
//
// Groups live under a common parent ("aenv" by default) in each hierarchy
// and are named by the caller (a sandbox id), so a restarted node finds the
// groups of the VMMs it adopts, and removes those no record owns.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits bound a group. Zero fields leave that resource unlimited.
type Limits struct {
	// CPUs is the CPU time the group may use, in CPUs (1.5: one and a half
	// cores' worth per period).
	CPUs float64
	// MemoryBytes bounds the group's memory (the VMM's RAM and its own).
	MemoryBytes int64
	// Pids bounds the group's processes and threads.
	Pids int
}

// controllers the package manages.
var controllers = []string{"cpu", "memory", "pids"}

// Hierarchy names where each controller's groups are made: Dirs maps a
// controller to the parent directory of the groups (under the root of its
// hierarchy, Roots), V2 says which controllers are unified.
type Hierarchy struct {
	Roots map[string]string
	Dirs  map[string]string
	V2    map[string]bool
	// Undelegated names the controllers Delegated found not delegated to
	// the process: groups are made without them (no limit of theirs).
	Undelegated []string
}

// managed lists the controllers groups are made in.
func (h *Hierarchy) managed() []string {
	var out []string
	for _, c := range controllers {
		if h.Dirs[c] != "" {
			out = append(out, c)
		}
	}
	return out
}

// Detect finds the hierarchies of the cpu, memory and pids controllers
// from /proc/self/mountinfo and returns them with parent (a relative path,
// e.g. "aenv/<node>") as the directory of every group. A controller without
// a hierarchy is an error naming it.
func Detect(parent string) (*Hierarchy, error) {
	return DetectIn("/proc/self/mountinfo", parent)
}

// DetectIn is Detect reading the mount table from mountinfo (a file in the
// format of /proc/self/mountinfo).
func DetectIn(mountinfo, parent string) (*Hierarchy, error) {
	parent = filepath.Clean(parent)
	if parent == "." || filepath.IsAbs(parent) || strings.HasPrefix(parent, "..") {
		return nil, fmt.Errorf("cgroup: parent %q is not a relative path below the root", parent)
	}
	mounts, err := readMounts(mountinfo)
	if err != nil {
		return nil, err
	}
	h := &Hierarchy{Roots: map[string]string{}, Dirs: map[string]string{}, V2: map[string]bool{}}
	var unified []string
	if root, ok := mounts["cgroup2"]; ok {
		b, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		unified = strings.Fields(string(b))
		for _, c := range controllers {
			if slices.Contains(unified, c) {
				h.Roots[c], h.Dirs[c], h.V2[c] = root, filepath.Join(root, parent), true
			}
		}
	}
	for _, c := range controllers {
		if h.Dirs[c] != "" {
			continue
		}
		root, ok := mounts["cgroup:"+c]
		if !ok {
			return nil, fmt.Errorf("cgroup: no hierarchy has the %s controller (unified has %v)", c, unified)
		}
		h.Roots[c], h.Dirs[c] = root, filepath.Join(root, parent)
	}
	return h, nil
}

// Writable checks, without creating anything, that groups can be made under
// every controller's parent: its nearest existing directory must be
// writable. A hierarchy mounted read-only (a container's default, or a
// systemd service with ProtectControlGroups=yes and no delegated subtree)
// fails here with an error naming the directory.
func (h *Hierarchy) Writable() error {
	for _, c := range h.managed() {
		d := h.Dirs[c]
		for {
			if _, err := os.Stat(d); err == nil || d == h.Roots[c] || d == filepath.Dir(d) {
				break
			}
			d = filepath.Dir(d)
		}
		if err := unix.Access(d, unix.W_OK); err != nil {
			if errors.Is(err, unix.EROFS) {
				return fmt.Errorf("cgroup: the %s hierarchy at %s is mounted read-only: %w", c, d, err)
			}
			return fmt.Errorf("cgroup: cannot create groups in %s (%s controller): %w", d, c, err)
		}
	}
	return nil
}

// readMounts maps "cgroup2" and "cgroup:<controller>" to mount points.
func readMounts(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cgroup: read mounts: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	whole := map[string]bool{} // out[key] mounts the hierarchy's root
	set := func(key, mountpoint, root string) {
		// A bind mount of a group below the root (systemd's ReadWritePaths=
		// of a delegated group) does not replace the hierarchy's mount.
		if whole[key] && root != "/" {
			return
		}
		out[key], whole[key] = mountpoint, root == "/"
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch tail[0] {
		case "cgroup2":
			set("cgroup2", fields[4], fields[3])
		case "cgroup":
			for _, o := range strings.Split(tail[2], ",") {
				if slices.Contains(controllers, o) {
					set("cgroup:"+o, fields[4], fields[3])
				}
			}
		}
	}
	return out, sc.Err()
}

// Group is one named group in every hierarchy.
type Group struct {
	h    *Hierarchy
	name string
}

// validName keeps group names to one path element.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// Open returns the group name (made or not).
func (h *Hierarchy) Open(name string) (*Group, error) {
	if !validName(name) {
		return nil, fmt.Errorf("cgroup: bad group name %q", name)
	}
	return &Group{h: h, name: name}, nil
}

// Create makes the group name with limits l (an existing group of that
// name gets the limits).
func (h *Hierarchy) Create(name string, l Limits) (*Group, error) {
	g, err := h.Open(name)
	if err != nil {
		return nil, err
	}
	for _, c := range h.managed() {
		if err := h.prepareParent(c); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(g.dir(c), 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: create %s/%s: %w", c, name, err)
		}
	}
	if err := g.setLimits(l); err != nil {
		_ = g.Remove()
		return nil, err
	}
	return g, nil
}

// prepareParent makes the parent directory; on v2 it also enables the
// controller for the children of every level from the root down.
func (h *Hierarchy) prepareParent(c string) error {
	dir := h.Dirs[c]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup: create %s: %w", dir, err)
	}
	if !h.V2[c] {
		return nil
	}
	rel, err := filepath.Rel(h.Roots[c], dir)
	if err != nil {
		return fmt.Errorf("cgroup: %s is not under %s", dir, h.Roots[c])
	}
	d := h.Roots[c]
	for _, elem := range append([]string{""}, strings.Split(rel, string(filepath.Separator))...) {
		d = filepath.Join(d, elem)
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			return fmt.Errorf("cgroup: enable %s in %s: %w", c, d, err)
		}
	}
	return nil
}

func (g *Group) dir(c string) string { return filepath.Join(g.h.Dirs[c], g.name) }

// Name is the group's name.
func (g *Group) Name() string { return g.name }

func (g *Group) write(c, file, value string) error {
	if err := os.WriteFile(filepath.Join(g.dir(c), file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup: set %s of %s: %w", file, g.name, err)
	}
	return nil
}

func (g *Group) setLimits(l Limits) error {
	const period = 100000 // µs
	if l.CPUs > 0 && g.h.Dirs["cpu"] != "" {
		quota := strconv.Itoa(int(l.CPUs * period))
		if g.h.V2["cpu"] {
			if err := g.write("cpu", "cpu.max", quota+" "+strconv.Itoa(period)); err != nil {
				return err
			}
		} else if err := errors.Join(g.write("cpu", "cpu.cfs_period_us", strconv.Itoa(period)),
			g.write("cpu", "cpu.cfs_quota_us", quota)); err != nil {
			return err
		}
	}
	if l.MemoryBytes > 0 && g.h.Dirs["memory"] != "" {
		file := "memory.limit_in_bytes"
		if g.h.V2["memory"] {
			file = "memory.max"
		}
		if err := g.write("memory", file, strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := g.write("pids", "pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// Add moves process pid (all its threads) into the group.
func (g *Group) Add(pid int) error {
	for _, c := range g.h.managed() {
		if err := g.write(c, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// Procs lists the processes in the group (of the pids hierarchy).
func (g *Group) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir("pids"), "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup: processes of %s: %w", g.name, err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Remove removes the group, killing what still runs in it first (a VMM
// whose stop failed must not outlive its group). A group already gone is
// no error.
func (g *Group) Remove() error {
	var errs []error
	for _, c := range g.h.managed() {
		dir := g.dir(c)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := rmdirKilling(dir); err != nil {
			errs = append(errs, fmt.Errorf("cgroup: remove %s/%s: %w", c, g.name, err))
		}
	}
	return errors.Join(errs...)
}

// rmdirKilling kills the group's processes and removes its directory,
// waiting briefly for them to leave (rmdir fails with EBUSY until then).
func rmdirKilling(dir string) error {
	var err error
	for range 100 {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, perr := strconv.Atoi(f); perr == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// List names the groups under the parent (in the pids hierarchy).
func (h *Hierarchy) List() ([]string, error) {
	ents, err := os.ReadDir(h.Dirs["pids"])
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: list groups: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
