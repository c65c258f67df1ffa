package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Delegated is DetectIn for a process whose own control group was
// delegated to it (systemd's Delegate=): the groups go under that group
// (its path in each hierarchy read from selfCgroup, a file in the format of
// /proc/self/cgroup) instead of under the hierarchy's root, which a
// service cannot write. On cgroup v2 a group with controllers enabled for
// its children may hold no process itself, so EnterLeaf must move the
// process into a leaf below it before the first group is made.
func Delegated(mountinfo, selfCgroup, parent string) (*Hierarchy, error) {
	h, err := DetectIn(mountinfo, parent)
	if err != nil {
		return nil, err
	}
	own, err := readSelf(selfCgroup)
	if err != nil {
		return nil, err
	}
	unit, ok := own[""]
	if !ok {
		unit = own["name=systemd"]
	}
	for _, c := range controllers {
		key := c
		if h.V2[c] {
			key = ""
		}
		p, ok := own[key]
		if !ok {
			return nil, fmt.Errorf("cgroup: %s names no group of this process for the %s controller", selfCgroup, c)
		}
		// A v1 controller the service manager did not delegate (the process
		// sits in a group of a parent there: systemd leaves cpu with the
		// slice when cpu and cpuacct are mounted apart) is left alone.
		if !h.V2[c] && unit != "" && p != unit && c != "pids" {
			delete(h.Roots, c)
			delete(h.Dirs, c)
			h.Undelegated = append(h.Undelegated, c)
			continue
		}
		// A leaf made by EnterLeaf (a restart of the process, or systemd's
		// DelegateSubgroup=) is not the delegated group itself.
		if h.V2[c] && filepath.Base(p) == LeafName {
			p = filepath.Dir(p)
		}
		h.Roots[c] = filepath.Join(h.Roots[c], p)
		h.Dirs[c] = filepath.Join(h.Roots[c], parent)
	}
	return h, nil
}

// LeafName is the group below the delegated one that EnterLeaf moves the
// process into.
const LeafName = "aenvd"

// EnterLeaf moves process pid into the leaf LeafName of the delegated v2
// group (made if missing), so the delegated group can enable controllers
// for the groups made beside the leaf. Hierarchies without v2 controllers
// need nothing.
func (h *Hierarchy) EnterLeaf(pid int) error {
	for _, c := range controllers {
		if !h.V2[c] {
			continue
		}
		leaf := filepath.Join(h.Roots[c], LeafName)
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return fmt.Errorf("cgroup: create the leaf %s: %w", leaf, err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup: move process %d into %s: %w", pid, leaf, err)
		}
		return nil // one unified hierarchy
	}
	return nil
}

// readSelf maps each v1 controller of a /proc/PID/cgroup file to the
// process's group in it, and "" to its v2 group.
func readSelf(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cgroup: read own groups: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controller,list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		if parts[1] == "" || parts[1] == "name=systemd" {
			out[parts[1]] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if slices.Contains(controllers, c) {
				out[c] = parts[2]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroup: read own groups: %w", err)
	}
	return out, nil
}
