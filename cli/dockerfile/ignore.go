package dockerfile

import (
	"path"
	"regexp"
	"strings"
)

// Ignore is a parsed .dockerignore: patterns in filepath.Match syntax plus
// `**` (any number of directories), matched against context-relative paths
// and their parent directories; a later `!pattern` re-includes.
type Ignore struct {
	rules []ignoreRule
}

type ignoreRule struct {
	re     *regexp.Regexp
	negate bool
}

// ParseIgnore parses .dockerignore text; lines that do not form a valid
// pattern are skipped (Docker would fail the build on them; we stay lenient
// rather than refuse a context).
func ParseIgnore(text string) *Ignore {
	ig := &Ignore{}
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		neg := strings.HasPrefix(l, "!")
		if neg {
			l = strings.TrimSpace(l[1:])
		}
		l = strings.TrimPrefix(path.Clean("/"+l), "/")
		if l == "" {
			continue
		}
		re, err := regexp.Compile(globRegexp(l))
		if err != nil {
			continue
		}
		ig.rules = append(ig.rules, ignoreRule{re: re, negate: neg})
	}
	return ig
}

// globRegexp translates a pattern: `**` spans directories, `*` and `?` stay
// within one, `[...]` classes pass through, everything else is literal.
func globRegexp(p string) string {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		ch := p[i]
		switch {
		case ch == '*' && i+1 < len(p) && p[i+1] == '*':
			i++
			if i+1 < len(p) && p[i+1] == '/' {
				i++
				b.WriteString("(.*/)?")
			} else {
				b.WriteString(".*")
			}
		case ch == '*':
			b.WriteString("[^/]*")
		case ch == '?':
			b.WriteString("[^/]")
		case ch == '[':
			j := strings.IndexByte(p[i:], ']')
			if j < 0 {
				b.WriteString(`\[`)
				continue
			}
			class := p[i+1 : i+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j
		case ch == '\\' && i+1 < len(p):
			i++
			b.WriteString(regexp.QuoteMeta(string(p[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(ch)))
		}
	}
	b.WriteString("$")
	return b.String()
}

// Excluded reports whether a context-relative path is ignored: the last rule
// that matches it or one of its parent directories decides.
func (ig *Ignore) Excluded(rel string) bool {
	if ig == nil || len(ig.rules) == 0 {
		return false
	}
	excluded := false
	for _, r := range ig.rules {
		if matchOrParent(r.re, rel) {
			excluded = !r.negate
		}
	}
	return excluded
}

func matchOrParent(re *regexp.Regexp, rel string) bool {
	for p := rel; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if re.MatchString(p) {
			return true
		}
	}
	return false
}

// HasExceptions reports whether some rule re-includes paths, so that ignored
// directories must still be walked.
func (ig *Ignore) HasExceptions() bool {
	if ig == nil {
		return false
	}
	for _, r := range ig.rules {
		if r.negate {
			return true
		}
	}
	return false
}
