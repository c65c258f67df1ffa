// Package users resolves sandbox user names to credentials (uid, gid,
// supplementary groups, home, shell) from the guest's own /etc/passwd and
// /etc/group. It parses the files itself rather than using os/user so that a
// static (CGO_ENABLED=0) agent behaves the same on the host and in the guest,
// and so that the parsers can be fuzzed: the files belong to the sandbox,
// whose owner may write anything into them.
package users

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
)

// ErrUnknown is returned when a user name or id is not in the database.
var ErrUnknown = errors.New("unknown user")

// User is one account with everything needed to run a process as it.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, including GID
	Home   string
	Shell  string
}

// PasswdEntry is one parsed line of /etc/passwd.
type PasswdEntry struct {
	Name  string
	UID   uint32
	GID   uint32
	Home  string
	Shell string
}

// GroupEntry is one parsed line of /etc/group.
type GroupEntry struct {
	Name    string
	GID     uint32
	Members []string
}

// maxLine bounds a line so a hostile file cannot make the scanner grow without limit.
const maxLine = 64 << 10

// ParsePasswd reads passwd(5) lines. Malformed lines are skipped, as libc does.
func ParsePasswd(r io.Reader) ([]PasswdEntry, error) {
	var out []PasswdEntry
	err := scanLines(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] == "" {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		out = append(out, PasswdEntry{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]})
	})
	if err != nil {
		return nil, fmt.Errorf("parse passwd: %w", err)
	}
	return out, nil
}

// ParseGroup reads group(5) lines. Malformed lines are skipped.
func ParseGroup(r io.Reader) ([]GroupEntry, error) {
	var out []GroupEntry
	err := scanLines(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		out = append(out, GroupEntry{Name: f[0], GID: uint32(gid), Members: members})
	})
	if err != nil {
		return nil, fmt.Errorf("parse group: %w", err)
	}
	return out, nil
}

func scanLines(r io.Reader, fn func(string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(line)
	}
	return sc.Err()
}

// DB answers lookups from a passwd and a group file, re-reading them when
// they change (users may be added inside a running sandbox).
type DB struct {
	PasswdPath string
	GroupPath  string

	mu     sync.Mutex
	stamp  string
	passwd []PasswdEntry
	groups []GroupEntry
}

// NewDB returns a database over the standard files.
func NewDB() *DB { return &DB{PasswdPath: "/etc/passwd", GroupPath: "/etc/group"} }

// Lookup returns the user called name.
func (db *DB) Lookup(name string) (*User, error) {
	pw, gr, err := db.snapshot()
	if err != nil {
		return nil, err
	}
	for _, e := range pw {
		if e.Name == name {
			return build(e, gr), nil
		}
	}
	return nil, fmt.Errorf("lookup user %q: %w", name, ErrUnknown)
}

// LookupUID returns the first user with the given uid.
func (db *DB) LookupUID(uid uint32) (*User, error) {
	pw, gr, err := db.snapshot()
	if err != nil {
		return nil, err
	}
	for _, e := range pw {
		if e.UID == uid {
			return build(e, gr), nil
		}
	}
	return nil, fmt.Errorf("lookup uid %d: %w", uid, ErrUnknown)
}

// UserName returns the name of uid, or the number as text when unknown.
func (db *DB) UserName(uid uint32) string {
	if u, err := db.LookupUID(uid); err == nil {
		return u.Name
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// GroupName returns the name of gid, or the number as text when unknown.
func (db *DB) GroupName(gid uint32) string {
	_, gr, err := db.snapshot()
	if err == nil {
		for _, g := range gr {
			if g.GID == gid {
				return g.Name
			}
		}
	}
	return strconv.FormatUint(uint64(gid), 10)
}

func build(e PasswdEntry, groups []GroupEntry) *User {
	u := &User{Name: e.Name, UID: e.UID, GID: e.GID, Home: e.Home, Shell: e.Shell, Groups: []uint32{e.GID}}
	for _, g := range groups {
		if g.GID == e.GID {
			continue
		}
		for _, m := range g.Members {
			if m == e.Name {
				u.Groups = append(u.Groups, g.GID)
				break
			}
		}
	}
	return u
}

// snapshot returns the parsed files, reloading them when their size or
// modification time changed.
func (db *DB) snapshot() ([]PasswdEntry, []GroupEntry, error) {
	stamp := fileStamp(db.PasswdPath) + "|" + fileStamp(db.GroupPath)
	db.mu.Lock()
	defer db.mu.Unlock()
	if stamp == db.stamp && db.passwd != nil {
		return db.passwd, db.groups, nil
	}
	pw, err := parseFile(db.PasswdPath, ParsePasswd)
	if err != nil {
		return nil, nil, err
	}
	gr, err := parseFile(db.GroupPath, ParseGroup)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	db.stamp, db.passwd, db.groups = stamp, pw, gr
	return pw, gr, nil
}

func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "-"
	}
	return fmt.Sprintf("%d.%d", fi.Size(), fi.ModTime().UnixNano())
}

func parseFile[T any](path string, parse func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	return parse(f)
}
