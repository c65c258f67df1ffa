// Package dockerfile turns a Dockerfile into an E2B template build: the base
// image, the steps (RUN, ENV, WORKDIR, USER, COPY in E2B's wire format) and
// the start command; and packs the build-context files of each COPY step into
// a deterministic tar archive, addressed by its SHA-256, for upload.
//
// What is supported and how it maps:
//
//   - FROM image [AS name]: the base image (one stage only; FROM scratch,
//     a second FROM and COPY --from are errors). ARGs declared before FROM
//     substitute into it.
//   - RUN (shell and exec form) → RUN [command]; exec form is shell-quoted.
//     ARG values in scope are exported for the command, as Docker does.
//     RUN --mount=type=cache is ignored with a warning; other flags are errors.
//   - ENV (k=v ... and legacy `k v`) → ENV [k, v, ...]; ARG (with defaults and
//     --build-arg overrides) only substitutes and feeds RUN.
//   - WORKDIR (resolved against the previous one) → WORKDIR [absolute path];
//     USER → USER [user].
//   - COPY/ADD [--chown] [--chmod] src... dest → one COPY [src, dest, user,
//     mode] step per source, dest made absolute against WORKDIR; sources are
//     local only (ADD of URLs and of archives is an error; see Pack). The
//     files get the user's primary group (a --chown group is ignored with a
//     warning).
//   - CMD/ENTRYPOINT → the start command (combined as Docker does).
//   - LABEL, MAINTAINER, EXPOSE, VOLUME, STOPSIGNAL, HEALTHCHECK and ONBUILD
//     do not affect a sandbox: ignored with a warning. SHELL (it would change
//     how RUN runs) and anything else are errors naming the line.
//
// Variables are substituted where Docker substitutes them (FROM, ENV, ARG,
// WORKDIR, USER, COPY, ADD; not RUN/CMD/ENTRYPOINT, where the shell does).
// The base image's own variables are not known here: they expand to empty,
// with a warning, except PATH which falls back to Docker's default PATH.
//
// Like E2B's own Dockerfile conversion, steps start as root in / (Docker's
// defaults) and, unless the Dockerfile sets them, end with USER user and
// WORKDIR /home/user (the sandbox defaults).
package dockerfile

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// Step is one build step in E2B's wire format.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	// Line is the Dockerfile line the step comes from (0 for implied steps).
	Line int `json:"-"`
	// Add marks a COPY step that came from ADD (archives are refused when
	// packing).
	Add bool `json:"-"`
}

// Spec is the build a Dockerfile describes.
type Spec struct {
	FromImage string
	Steps     []Step
	StartCmd  string
	// Warnings name the ignored instructions and other approximations.
	Warnings []string
}

// Options tune Parse.
type Options struct {
	// BuildArgs override ARG defaults (--build-arg k=v).
	BuildArgs map[string]string
}

// Error is a Dockerfile that cannot be built, with the line at fault.
type Error struct {
	Line        int
	Instruction string
	Msg         string
}

func (e *Error) Error() string {
	if e.Instruction == "" {
		return fmt.Sprintf("Dockerfile line %d: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("Dockerfile line %d: %s: %s", e.Line, e.Instruction, e.Msg)
}

// DefaultPath is Docker's PATH for images that set none; it stands in for the
// base image's PATH in substitutions.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ignored instructions do not change what a sandbox sees.
var ignored = map[string]string{
	"LABEL":       "metadata only",
	"MAINTAINER":  "metadata only",
	"EXPOSE":      "sandbox ports are all reachable through the proxy",
	"VOLUME":      "sandboxes have no volumes; the path stays part of the filesystem",
	"STOPSIGNAL":  "sandboxes are stopped by the node",
	"HEALTHCHECK": "use --ready-cmd for readiness",
	"ONBUILD":     "it would only affect images built from this one",
}

type parser struct {
	spec      Spec
	escape    rune
	buildArgs map[string]string
	usedArgs  map[string]bool
	globalArg map[string]string // ARGs before FROM, with values
	args      map[string]string // ARGs in scope after FROM, with values
	argOrder  []string
	env       map[string]string // ENV set by this Dockerfile
	workdir   string
	userSet   bool
	workSet   bool
	from      bool
	entry     *command
	cmd       *command
}

// command is a CMD or ENTRYPOINT: exec form (argv) or shell form.
type command struct {
	argv  []string
	shell string
	exec  bool
}

// Parse parses a Dockerfile.
func Parse(src string, opt Options) (*Spec, error) {
	lines, escape, err := splitLines(src)
	if err != nil {
		return nil, err
	}
	p := &parser{escape: escape, buildArgs: opt.BuildArgs, usedArgs: map[string]bool{},
		globalArg: map[string]string{}, args: map[string]string{}, env: map[string]string{}, workdir: "/"}
	for _, l := range lines {
		if err := p.instruction(l); err != nil {
			return nil, err
		}
	}
	if !p.from {
		return nil, &Error{Line: max(1, len(strings.Split(src, "\n"))), Msg: "no FROM instruction: a build needs a base image"}
	}
	if !p.userSet {
		p.step(0, "USER", "user")
	}
	if !p.workSet {
		p.step(0, "WORKDIR", "/home/user")
	}
	p.spec.StartCmd = p.startCmd()
	for _, k := range slices.Sorted(maps.Keys(p.buildArgs)) {
		if !p.usedArgs[k] {
			p.warn(0, fmt.Sprintf("--build-arg %s is not declared by an ARG; not used", k))
		}
	}
	return &p.spec, nil
}

func (p *parser) warn(line int, msg string) {
	if line > 0 {
		msg = fmt.Sprintf("line %d: %s", line, msg)
	}
	p.spec.Warnings = append(p.spec.Warnings, msg)
}

func (p *parser) step(line int, typ string, args ...string) {
	p.spec.Steps = append(p.spec.Steps, Step{Type: typ, Args: args, Line: line})
}

func (p *parser) instruction(l line) error {
	fail := func(format string, a ...any) error {
		return &Error{Line: l.num, Instruction: l.cmd, Msg: fmt.Sprintf(format, a...)}
	}
	if !p.from && l.cmd != "FROM" && l.cmd != "ARG" {
		return fail("comes before FROM (only ARG may)")
	}
	var err error
	switch l.cmd {
	case "FROM":
		err = p.from1(l)
	case "ARG":
		err = p.arg(l)
	case "ENV":
		err = p.envInstr(l)
	case "RUN":
		err = p.run(l)
	case "WORKDIR":
		err = p.workdirInstr(l)
	case "USER":
		err = p.user(l)
	case "COPY", "ADD":
		err = p.copyInstr(l)
	case "CMD", "ENTRYPOINT":
		err = p.cmdInstr(l)
	case "SHELL":
		return fail("not supported: RUN steps always run with the sandbox's shell; write the shell into the RUN command instead")
	default:
		if why, ok := ignored[l.cmd]; ok {
			p.warn(l.num, fmt.Sprintf("%s ignored (%s)", l.cmd, why))
			return nil
		}
		return fail("unknown or unsupported instruction (aenv supports FROM, RUN, ENV, ARG, WORKDIR, USER, COPY, ADD, CMD, ENTRYPOINT; ignores %s)", strings.Join(slices.Sorted(maps.Keys(ignored)), ", "))
	}
	if err != nil {
		return &Error{Line: l.num, Instruction: l.cmd, Msg: err.Error()}
	}
	return nil
}

// lookupAfterFrom resolves variables after FROM: ENV wins over ARG; PATH
// falls back to Docker's default.
func (p *parser) lookupAfterFrom(name string) (string, bool) {
	if v, ok := p.env[name]; ok {
		return v, true
	}
	if v, ok := p.args[name]; ok {
		return v, true
	}
	if name == "PATH" {
		return DefaultPath, true
	}
	return "", false
}

func (p *parser) lookup() lookup {
	if !p.from {
		return func(name string) (string, bool) {
			v, ok := p.globalArg[name]
			return v, ok
		}
	}
	return p.lookupAfterFrom
}

func (p *parser) noteUnknown(line int, names []string) {
	for _, n := range names {
		p.warn(line, fmt.Sprintf("$%s is not set by this Dockerfile (the base image's value is not known to aenv): expanded to empty", n))
	}
}

// flags splits leading --name[=value] flags off words.
func flags(ws []string) (map[string][]string, []string) {
	fl := map[string][]string{}
	for len(ws) > 0 && strings.HasPrefix(ws[0], "--") {
		k, v, _ := strings.Cut(ws[0][2:], "=")
		fl[k] = append(fl[k], v)
		ws = ws[1:]
	}
	return fl, ws
}

func (p *parser) from1(l line) error {
	if p.from {
		return fmt.Errorf("multi-stage builds are not supported (a second FROM); build one stage")
	}
	ws, unknown, err := words(l.rest, p.escape, p.lookup())
	if err != nil {
		return err
	}
	p.noteUnknown(l.num, unknown)
	fl, ws := flags(ws)
	for _, k := range slices.Sorted(maps.Keys(fl)) {
		v := fl[k]
		if k != "platform" {
			return fmt.Errorf("flag --%s is not supported", k)
		}
		if v[0] != "linux/amd64" && v[0] != "linux/x86_64" {
			return fmt.Errorf("--platform=%s: aenv builds linux/amd64 only", v[0])
		}
	}
	switch {
	case len(ws) == 0:
		return fmt.Errorf("names no image")
	case len(ws) == 3 && strings.EqualFold(ws[1], "AS"):
		p.warn(l.num, fmt.Sprintf("stage name %q ignored (one stage only)", ws[2]))
	case len(ws) != 1:
		return fmt.Errorf("want FROM IMAGE [AS NAME], got %q", l.rest)
	}
	if ws[0] == "" {
		return fmt.Errorf("names no image (an ARG expanded to empty?)")
	}
	if strings.EqualFold(ws[0], "scratch") {
		return fmt.Errorf("FROM scratch is not supported: a sandbox needs a base image with a userland (e.g. debian:12-slim)")
	}
	p.spec.FromImage = ws[0]
	p.from = true
	// Docker's defaults for the first steps (see the package doc).
	p.step(0, "USER", "root")
	p.step(0, "WORKDIR", "/")
	return nil
}

func (p *parser) arg(l line) error {
	ws, unknown, err := words(l.rest, p.escape, p.lookup())
	if err != nil {
		return err
	}
	p.noteUnknown(l.num, unknown)
	if len(ws) == 0 {
		return fmt.Errorf("names no variable")
	}
	for _, w := range ws {
		name, def, hasDef := strings.Cut(w, "=")
		if !validName(name) {
			return fmt.Errorf("invalid variable name %q", name)
		}
		val, set := def, hasDef
		if v, ok := p.buildArgs[name]; ok {
			val, set = v, true
			p.usedArgs[name] = true
		}
		if !p.from {
			if set {
				p.globalArg[name] = val
			}
			continue
		}
		if !set {
			// ARG NAME after FROM inherits a global ARG's value.
			val, set = p.globalArg[name]
		}
		if !set {
			delete(p.args, name)
			continue
		}
		if _, ok := p.args[name]; !ok {
			p.argOrder = append(p.argOrder, name)
		}
		p.args[name] = val
	}
	return nil
}

func validName(n string) bool {
	if n == "" || !isNameStart(rune(n[0])) {
		return false
	}
	for _, r := range n {
		if !isNameChar(r) {
			return false
		}
	}
	return true
}

func (p *parser) envInstr(l line) error {
	ws, unknown, err := words(l.rest, p.escape, p.lookupAfterFrom)
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return fmt.Errorf("names no variable")
	}
	var kv []string
	if !strings.Contains(ws[0], "=") {
		// Legacy form: ENV NAME the rest of the line.
		name := ws[0]
		rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimLeft(l.rest, " \t"), firstRawWord(l.rest)))
		if rest == "" {
			return fmt.Errorf("%s has no value (write ENV %s=VALUE)", name, name)
		}
		val, unk, err := word(rest, p.escape, p.lookupAfterFrom)
		if err != nil {
			return err
		}
		unknown = unk
		kv = []string{name, val}
	} else {
		for _, w := range ws {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return fmt.Errorf("%q is not NAME=VALUE (mixing `ENV k v` and `ENV k=v` forms?)", w)
			}
			kv = append(kv, k, v)
		}
	}
	p.noteUnknown(l.num, unknown)
	for i := 0; i < len(kv); i += 2 {
		if !validName(kv[i]) {
			return fmt.Errorf("invalid variable name %q", kv[i])
		}
		p.env[kv[i]] = kv[i+1]
	}
	p.step(l.num, "ENV", kv...)
	return nil
}

// firstRawWord is the first blank-separated word of s, unprocessed.
func firstRawWord(s string) string {
	s = strings.TrimLeft(s, " \t")
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

// execForm parses the JSON (exec) form of RUN, CMD, ENTRYPOINT, COPY, ADD.
func execForm(s string) ([]string, bool) {
	if !strings.HasPrefix(s, "[") {
		return nil, false
	}
	var argv []string
	if json.Unmarshal([]byte(s), &argv) != nil {
		return nil, false
	}
	return argv, true
}

// leadingFlags splits --flags off the raw text of RUN (whose command is not
// processed as words).
func leadingFlags(s string) (map[string][]string, string) {
	fl := map[string][]string{}
	for strings.HasPrefix(s, "--") {
		w := firstRawWord(s)
		k, v, _ := strings.Cut(w[2:], "=")
		fl[k] = append(fl[k], v)
		s = strings.TrimLeft(strings.TrimPrefix(s, w), " \t")
	}
	return fl, s
}

func (p *parser) run(l line) error {
	fl, rest := leadingFlags(l.rest)
	for _, k := range slices.Sorted(maps.Keys(fl)) {
		for _, v := range fl[k] {
			if k == "mount" && strings.Contains(","+v+",", ",type=cache,") {
				p.warn(l.num, "RUN --mount=type=cache ignored (the directory is part of the template)")
				continue
			}
			return fmt.Errorf("flag --%s is not supported", k)
		}
	}
	if strings.HasPrefix(rest, "<<") {
		return fmt.Errorf("heredocs are not supported; write the script into the build context and COPY it")
	}
	cmd := rest
	if argv, ok := execForm(rest); ok {
		if len(argv) == 0 {
			return fmt.Errorf("empty exec form")
		}
		cmd = shellJoin(argv)
	}
	if strings.TrimSpace(cmd) == "" {
		return fmt.Errorf("no command")
	}
	// Docker gives RUN the ARGs in scope as environment variables (ENV of
	// the same name wins).
	var exports []string
	for _, k := range p.argOrder {
		if _, ok := p.env[k]; ok {
			continue
		}
		if v, ok := p.args[k]; ok {
			exports = append(exports, k+"="+shellQuote(v))
		}
	}
	if len(exports) > 0 {
		cmd = "export " + strings.Join(exports, " ") + "; " + cmd
	}
	p.step(l.num, "RUN", cmd)
	return nil
}

func (p *parser) workdirInstr(l line) error {
	dir, unknown, err := word(l.rest, p.escape, p.lookupAfterFrom)
	if err != nil {
		return err
	}
	p.noteUnknown(l.num, unknown)
	if dir == "" {
		return fmt.Errorf("names no directory")
	}
	if !path.IsAbs(dir) {
		dir = path.Join(p.workdir, dir)
	}
	p.workdir = path.Clean(dir)
	p.workSet = true
	p.step(l.num, "WORKDIR", p.workdir)
	return nil
}

func (p *parser) user(l line) error {
	u, unknown, err := word(l.rest, p.escape, p.lookupAfterFrom)
	if err != nil {
		return err
	}
	p.noteUnknown(l.num, unknown)
	if u == "" || strings.ContainsAny(u, " \t") {
		return fmt.Errorf("want USER NAME[:GROUP], got %q", l.rest)
	}
	p.userSet = true
	p.step(l.num, "USER", u)
	return nil
}
