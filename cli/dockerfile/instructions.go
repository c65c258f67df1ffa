package dockerfile

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// The file-copying and command instructions (COPY, ADD, CMD, ENTRYPOINT)
// and the shell quoting their steps use.

func (p *parser) copyInstr(l line) error {
	var ws, unknown []string
	fl, rest := leadingFlags(l.rest)
	if argv, ok := execForm(rest); ok {
		for _, a := range argv {
			w, unk, err := word(a, p.escape, p.lookupAfterFrom)
			if err != nil {
				return err
			}
			unknown = append(unknown, unk...)
			ws = append(ws, w)
		}
	} else {
		var err error
		if ws, unknown, err = words(rest, p.escape, p.lookupAfterFrom); err != nil {
			return err
		}
	}
	p.noteUnknown(l.num, unknown)
	var chown, chmod string
	for _, k := range slices.Sorted(maps.Keys(fl)) {
		if k != "chown" && k != "chmod" && k != "link" && k != "from" {
			return fmt.Errorf("flag --%s is not supported", k)
		}
		v, err := p.flagValue(k, fl[k])
		if err != nil {
			return err
		}
		switch k {
		case "chown":
			// The build sets the owner's primary group; E2B's COPY step
			// carries a user only.
			u, g, hasGroup := strings.Cut(v, ":")
			if u == "" {
				return fmt.Errorf("--chown=%s: name a user", v)
			}
			if hasGroup && g != u {
				p.warn(l.num, fmt.Sprintf("--chown=%s: group %s ignored, the files get %s's primary group", v, g, u))
			}
			chown = u
		case "chmod":
			n, err := strconv.ParseUint(v, 8, 32)
			if err != nil || n > 0o7777 {
				return fmt.Errorf("--chmod=%s: give an octal mode such as 0755", v)
			}
			chmod = fmt.Sprintf("%04o", n)
		case "link":
			// Only changes how Docker stores layers.
		default: // from
			return fmt.Errorf("--from (copying from another stage or image) is not supported; copy from the build context")
		}
	}
	if len(ws) < 2 {
		return fmt.Errorf("want %s SRC... DEST", l.cmd)
	}
	dest := ws[len(ws)-1]
	if dest == "" {
		return fmt.Errorf("empty destination")
	}
	if !path.IsAbs(dest) {
		trail := strings.HasSuffix(dest, "/") || dest == "." || dest == ".."
		dest = path.Join(p.workdir, dest)
		if trail && dest != "/" {
			dest += "/"
		}
	}
	srcs := ws[:len(ws)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return fmt.Errorf("with several sources the destination must be a directory ending in /, got %q", dest)
	}
	for _, s := range srcs {
		src, err := contextPath(s, l.cmd == "ADD")
		if err != nil {
			return err
		}
		p.spec.Steps = append(p.spec.Steps, Step{Type: "COPY", Args: []string{src, dest, chown, chmod}, Line: l.num, Add: l.cmd == "ADD"})
	}
	return nil
}

func (p *parser) flagValue(k string, vs []string) (string, error) {
	if len(vs) > 1 {
		return "", fmt.Errorf("flag --%s given twice", k)
	}
	if vs[0] == "" && k != "link" {
		return "", fmt.Errorf("flag --%s needs a value (--%s=...)", k, k)
	}
	return vs[0], nil
}

// contextPath checks a COPY/ADD source: local, inside the build context.
// Absolute sources are relative to the context root, as in Docker.
func contextPath(s string, add bool) (string, error) {
	if s == "" {
		return "", fmt.Errorf("empty source")
	}
	if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
		if add {
			return "", fmt.Errorf("source %q: ADD of URLs is not supported; download it in a RUN step (curl/wget)", s)
		}
		return "", fmt.Errorf("source %q: COPY takes local files only", s)
	}
	c := path.Clean("/" + s)
	if rel := path.Clean(s); rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("source %q is outside the build context", s)
	}
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

func (p *parser) cmdInstr(l line) error {
	var c command
	if argv, ok := execForm(l.rest); ok {
		c = command{argv: argv, exec: true}
	} else {
		if l.rest == "" {
			return fmt.Errorf("no command")
		}
		c = command{shell: l.rest}
	}
	if l.cmd == "CMD" {
		p.cmd = &c
	} else {
		p.entry = &c
	}
	return nil
}

// startCmd combines ENTRYPOINT and CMD as Docker does, as a shell command.
func (p *parser) startCmd() string {
	asArgv := func(c *command) []string {
		if c.exec {
			return c.argv
		}
		return []string{"/bin/sh", "-c", c.shell}
	}
	switch {
	case p.entry != nil && !p.entry.exec:
		return p.entry.shell
	case p.entry != nil:
		argv := slices.Clone(p.entry.argv)
		if p.cmd != nil {
			argv = append(argv, asArgv(p.cmd)...)
		}
		return shellJoin(argv)
	case p.cmd != nil && !p.cmd.exec:
		return p.cmd.shell
	case p.cmd != nil:
		return shellJoin(p.cmd.argv)
	}
	return ""
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
