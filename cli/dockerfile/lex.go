package dockerfile

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// line is one logical line of a Dockerfile: an instruction with its
// continuation lines joined.
type line struct {
	num  int    // 1-based number of the line the instruction starts on
	cmd  string // the instruction keyword, upper case
	rest string // everything after the keyword, leading blanks trimmed
}

// maxWord bounds the size of one expanded word or value, so that a hostile
// Dockerfile cannot blow memory up with variables that reference each other.
const maxWord = 1 << 20

// maxDepth bounds nested ${...} substitutions.
const maxDepth = 32

var errTooLarge = errors.New("variable expansion too large (over 1 MiB)")

// splitLines parses the parser directives (only `escape` matters to us),
// drops comments and blank lines and joins continuation lines.
func splitLines(src string) (lines []line, escape rune, err error) {
	escape = '\\'
	raw := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	i := 0
	// Directives: `# key=value` lines at the very top.
	seen := map[string]bool{}
	for ; i < len(raw); i++ {
		k, v, ok := directive(raw[i])
		if !ok {
			break
		}
		if seen[k] {
			return nil, 0, &Error{Line: i + 1, Msg: fmt.Sprintf("parser directive %q given twice", k)}
		}
		seen[k] = true
		if k == "escape" {
			switch v {
			case "\\":
				escape = '\\'
			case "`":
				escape = '`'
			default:
				return nil, 0, &Error{Line: i + 1, Msg: fmt.Sprintf("escape directive %q: use \\ or `", v)}
			}
		}
	}
	for ; i < len(raw); i++ {
		t := strings.TrimLeftFunc(raw[i], unicode.IsSpace)
		if t == "" || t[0] == '#' {
			continue
		}
		start := i
		var b strings.Builder
		for {
			cur := strings.TrimRightFunc(raw[i], unicode.IsSpace)
			if !strings.HasSuffix(cur, string(escape)) {
				b.WriteString(raw[i])
				break
			}
			b.WriteString(strings.TrimSuffix(cur, string(escape)))
			// The next non-comment line continues this one; comment
			// lines inside a continuation are dropped, as Docker does.
			for i++; i < len(raw); i++ {
				n := strings.TrimLeftFunc(raw[i], unicode.IsSpace)
				if n == "" || n[0] != '#' {
					break
				}
			}
			if i >= len(raw) {
				break
			}
		}
		text := strings.TrimSpace(b.String())
		kw, rest := text, ""
		if k := strings.IndexFunc(text, unicode.IsSpace); k >= 0 {
			kw, rest = text[:k], text[k:]
		}
		lines = append(lines, line{num: start + 1, cmd: strings.ToUpper(kw), rest: strings.TrimSpace(rest)})
	}
	return lines, escape, nil
}

// directive reports whether s is a parser directive line `# key=value`.
func directive(s string) (key, val string, ok bool) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "#") {
		return "", "", false
	}
	k, v, ok := strings.Cut(strings.TrimSpace(s[1:]), "=")
	if !ok {
		return "", "", false
	}
	k = strings.ToLower(strings.TrimSpace(k))
	if k == "" || strings.ContainsFunc(k, unicode.IsSpace) {
		return "", "", false
	}
	return k, strings.TrimSpace(v), true
}

// lookup resolves a variable; ok is false for an unset one.
type lookup func(name string) (val string, ok bool)

// lexer processes one word of Docker's syntax: quotes, escapes and (when env is
// not nil) $VAR, ${VAR}, ${VAR:-word}, ${VAR:+word}, ${VAR-word},
// ${VAR+word}, ${VAR:?msg} and ${VAR?msg}.
type lexer struct {
	src    []rune
	pos    int
	escape rune
	env    lookup
	depth  int
	// unknown collects the names of unset variables that were expanded.
	unknown []string
}

// words splits s on unquoted blanks (see rawWords) and processes each word
// (see word): as Docker, an expanded value is never split again.
func words(s string, escape rune, env lookup) ([]string, []string, error) {
	raw, err := rawWords(s, escape)
	if err != nil {
		return nil, nil, err
	}
	var out, unknown []string
	for _, r := range raw {
		w, unk, err := word(r, escape, env)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, w)
		unknown = append(unknown, unk...)
	}
	return out, unknown, nil
}

// rawWords splits s on blanks outside quotes, keeping quotes and escapes.
func rawWords(s string, escape rune) ([]string, error) {
	var out []string
	var cur strings.Builder
	var quote rune
	open := false
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		ch := rs[i]
		switch {
		case quote != 0:
			cur.WriteRune(ch)
			if ch == escape && quote == '"' && i+1 < len(rs) {
				i++
				cur.WriteRune(rs[i])
			} else if ch == quote {
				quote = 0
			}
		case unicode.IsSpace(ch):
			if open {
				out = append(out, cur.String())
				cur.Reset()
				open = false
			}
		default:
			open = true
			cur.WriteRune(ch)
			if ch == '\'' || ch == '"' {
				quote = ch
			} else if ch == escape && i+1 < len(rs) {
				i++
				cur.WriteRune(rs[i])
			}
		}
	}
	if quote != 0 {
		if quote == '"' {
			return nil, errors.New("unterminated double quote")
		}
		return nil, errors.New("unterminated single quote")
	}
	if open {
		out = append(out, cur.String())
	}
	return out, nil
}

// word processes s as one word: quotes, escapes and variables are handled
// but blanks do not separate.
func word(s string, escape rune, env lookup) (string, []string, error) {
	lx := &lexer{src: []rune(s), escape: escape, env: env}
	w, err := lx.run(0)
	return strings.Join(w, ""), lx.unknown, err
}

// wordBuf accumulates words; a word exists once something (even an empty
// quoted string) was added to it.
type wordBuf struct {
	words []string
	cur   strings.Builder
	open  bool
	size  int
}

func (w *wordBuf) add(s string) error {
	w.cur.WriteString(s)
	w.open = true
	w.size += len(s)
	if w.size > maxWord {
		return errTooLarge
	}
	return nil
}

func (w *wordBuf) end() {
	if w.open {
		w.words = append(w.words, w.cur.String())
	}
	w.cur.Reset()
	w.open = false
}

// run lexes until the end of input, or until an unquoted '}' when stop is
// '}' (inside ${VAR:-word}); the '}' is consumed.
func (lx *lexer) run(stop rune) ([]string, error) {
	var w wordBuf
	for lx.pos < len(lx.src) {
		ch := lx.src[lx.pos]
		switch {
		case stop != 0 && ch == stop:
			lx.pos++
			w.end()
			return w.words, nil
		case ch == '\'':
			s, err := lx.single()
			if err != nil {
				return nil, err
			}
			if err := w.add(s); err != nil {
				return nil, err
			}
		case ch == '"':
			s, err := lx.double()
			if err != nil {
				return nil, err
			}
			if err := w.add(s); err != nil {
				return nil, err
			}
		case ch == lx.escape:
			lx.pos++
			if lx.pos < len(lx.src) {
				ch = lx.src[lx.pos]
				lx.pos++
			}
			if err := w.add(string(ch)); err != nil {
				return nil, err
			}
		case ch == '$' && lx.env != nil:
			v, err := lx.dollar()
			if err != nil {
				return nil, err
			}
			if err := w.add(v); err != nil {
				return nil, err
			}
		default:
			lx.pos++
			if err := w.add(string(ch)); err != nil {
				return nil, err
			}
		}
	}
	if stop != 0 {
		return nil, fmt.Errorf("missing %q", stop)
	}
	w.end()
	return w.words, nil
}

func (lx *lexer) single() (string, error) {
	lx.pos++ // opening quote
	start := lx.pos
	for lx.pos < len(lx.src) {
		if lx.src[lx.pos] == '\'' {
			s := string(lx.src[start:lx.pos])
			lx.pos++
			return s, nil
		}
		lx.pos++
	}
	return "", errors.New("unterminated single quote")
}

func (lx *lexer) double() (string, error) {
	lx.pos++ // opening quote
	var b strings.Builder
	for lx.pos < len(lx.src) {
		ch := lx.src[lx.pos]
		switch {
		case ch == '"':
			lx.pos++
			return b.String(), nil
		case ch == lx.escape && lx.pos+1 < len(lx.src):
			next := lx.src[lx.pos+1]
			if next == '"' || next == '$' || next == lx.escape {
				b.WriteRune(next)
			} else {
				b.WriteRune(ch)
				b.WriteRune(next)
			}
			lx.pos += 2
		case ch == '$' && lx.env != nil:
			v, err := lx.dollar()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
		default:
			b.WriteRune(ch)
			lx.pos++
		}
		if b.Len() > maxWord {
			return "", errTooLarge
		}
	}
	return "", errors.New("unterminated double quote")
}

func isNameStart(r rune) bool { return r == '_' || r < 128 && unicode.IsLetter(r) }
func isNameChar(r rune) bool  { return isNameStart(r) || r >= '0' && r <= '9' }

// dollar expands the variable reference at lx.pos (a '$').
func (lx *lexer) dollar() (string, error) {
	lx.pos++
	if lx.pos >= len(lx.src) {
		return "$", nil
	}
	ch := lx.src[lx.pos]
	if ch != '{' {
		if !isNameStart(ch) {
			return "$", nil // a lone $ stays
		}
		start := lx.pos
		for lx.pos < len(lx.src) && isNameChar(lx.src[lx.pos]) {
			lx.pos++
		}
		return lx.get(string(lx.src[start:lx.pos])), nil
	}
	lx.pos++
	start := lx.pos
	for lx.pos < len(lx.src) && isNameChar(lx.src[lx.pos]) {
		lx.pos++
	}
	name := string(lx.src[start:lx.pos])
	if name == "" {
		return "", errors.New("bad substitution: ${ without a variable name")
	}
	if lx.pos >= len(lx.src) {
		return "", fmt.Errorf("bad substitution: ${%s without }", name)
	}
	if lx.src[lx.pos] == '}' {
		lx.pos++
		return lx.get(name), nil
	}
	colon := false
	if lx.src[lx.pos] == ':' {
		colon = true
		lx.pos++
	}
	if lx.pos >= len(lx.src) {
		return "", fmt.Errorf("bad substitution: ${%s without }", name)
	}
	op := lx.src[lx.pos]
	if op != '-' && op != '+' && op != '?' {
		return "", fmt.Errorf("unsupported substitution ${%s%s%c...} (aenv supports ${VAR}, ${VAR:-word}, ${VAR:+word} and ${VAR:?message})", name, map[bool]string{true: ":"}[colon], op)
	}
	lx.pos++
	if lx.depth >= maxDepth {
		return "", errors.New("substitutions nested too deeply")
	}
	lx.depth++
	parts, err := lx.run('}')
	lx.depth--
	if err != nil {
		return "", fmt.Errorf("bad substitution ${%s...}: %w", name, err)
	}
	alt := strings.Join(parts, "")
	val, set := lx.env(name)
	if colon && val == "" {
		set = false
	}
	switch op {
	case '-':
		if set {
			return val, nil
		}
		return alt, nil
	case '+':
		if set {
			return alt, nil
		}
		return "", nil
	default: // '?'
		if set {
			return val, nil
		}
		if alt == "" {
			alt = "is not set"
		}
		return "", fmt.Errorf("%s: %s", name, alt)
	}
}

func (lx *lexer) get(name string) string {
	v, ok := lx.env(name)
	if !ok {
		lx.unknown = append(lx.unknown, name)
	}
	return v
}
