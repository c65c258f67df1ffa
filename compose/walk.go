package compose

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// checker walks the parsed tree: every node it visits costs one of its
// budget (an alias once per use), and it collects refusals.
type checker struct {
	budget int  // nodes
	bytes  int  // scalar bytes, charged at each visit like nodes
	over   bool // a budget ran out (reported once)
	errs   Errors
}

func (c *checker) fail(path, format string, args ...any) {
	if len(c.errs) < maxErrors {
		c.errs = append(c.errs, &Error{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
}

// done reports whether the walk should stop: the budget is spent or
// enough refusals were found.
func (c *checker) done() bool { return c.over || len(c.errs) >= maxErrors }

// node follows an alias and charges the visit; nil once the budget is
// spent or for a tag the checks do not know (refused; the walk then
// leaves that part).
func (c *checker) node(n *yaml.Node, path string) *yaml.Node {
	if c.over {
		return nil
	}
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	c.budget--
	if n != nil {
		c.bytes -= len(n.Value)
	}
	if c.budget < 0 || c.bytes < 0 || n == nil {
		c.over = true
		if len(c.errs) < maxErrors { // always said, even after maxErrors-1 others
			c.errs = append(c.errs, &Error{Path: path, Reason: fmt.Sprintf(
				"the compose file expands to more than %d YAML nodes or %d bytes of values (an alias counts at each use)", maxNodes, maxValueBytes)})
		}
		return nil
	}
	if !standardTags[n.Tag] {
		// Compose gives tags of its own meanings (!reset, !override)
		// these checks do not follow.
		c.fail(path, "has the YAML tag %s, which is not supported", n.Tag)
		return nil
	}
	if n.Kind == yaml.ScalarNode && !utf8.ValidString(n.Value) {
		c.fail(path, "is not valid UTF-8")
		return nil
	}
	if n.Kind == yaml.ScalarNode && !plainText(n) {
		c.fail(path, "%q is read as a %s but not written as JSON writes it (write it so, or quote it to keep the text)",
			clip(n.Value), strings.TrimPrefix(n.Tag, "!!"))
		return nil
	}
	return n
}

// plainText reports whether a number's or boolean's text is the one JSON
// gives its value (0x10, 0o17, 1e3, 00, True, .inf are not): the checks
// read the text, Project.File carries the value, and the two must agree.
func plainText(n *yaml.Node) bool {
	switch n.Tag {
	case "!!int", "!!float", "!!bool":
	default:
		return true
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return false
	}
	b, err := json.Marshal(v)
	return err == nil && string(b) == n.Value
}

// standardTags are the tags of plain YAML values.
var standardTags = map[string]bool{"!!str": true, "!!int": true, "!!float": true, "!!bool": true, "!!null": true,
	"!!timestamp": true, "!!map": true, "!!seq": true, "!!merge": true}

// pair is one key of a mapping, merges resolved.
type pair struct {
	key string
	val *yaml.Node
}

// mapping returns n's keys in order, the keys of a "<<" merge added where
// the mapping has none of its own (YAML's merge key, used by Compose files
// with extension fields); duplicate and non-string keys are refused. So
// are the merges YAML parsers resolve differently (two "<<" keys in one
// mapping, which PyYAML, Compose 1.29's, resolves last-wins; a key merged
// from two mappings): a value the checks skipped must not be the one
// Compose keeps.
func (c *checker) mapping(n *yaml.Node, path string, depth int) ([]pair, bool) {
	if n = c.node(n, path); n == nil {
		return nil, false
	}
	if depth > maxDepth {
		c.fail(path, "nested more than %d levels deep", maxDepth)
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		c.fail(path, "must be a mapping")
		return nil, false
	}
	var out []pair
	seen := map[string]bool{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := c.node(n.Content[i], path)
		if k == nil {
			return nil, false
		}
		if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "!!int" && k.Tag != "!!merge") {
			c.fail(path, "has a key that is not a string")
			continue
		}
		if k.Tag == "!!merge" {
			merges = append(merges, n.Content[i+1])
			continue
		}
		if seen[k.Value] {
			c.fail(join(path, k.Value), "duplicate key")
			continue
		}
		seen[k.Value] = true
		out = append(out, pair{k.Value, n.Content[i+1]})
	}
	if len(merges) > 1 {
		c.fail(join(path, "<<"), "more than one merge key in a mapping")
		return nil, false
	}
	fromMerge := map[string]bool{}
	for _, m := range merges {
		for _, p := range c.merged(m, path, depth) {
			switch {
			case seen[p.key]: // the mapping's own key wins, in every parser
			case fromMerge[p.key]:
				c.fail(join(path, p.key), "merged from more than one mapping")
			default:
				fromMerge[p.key] = true
				out = append(out, p)
			}
		}
	}
	return out, !c.done()
}

// merged is what a "<<" value brings: a mapping, or a sequence of them
// (the earlier ones win).
func (c *checker) merged(v *yaml.Node, path string, depth int) []pair {
	r := c.node(v, path)
	if r == nil {
		return nil
	}
	if r.Kind != yaml.SequenceNode {
		ps, _ := c.mapping(v, path, depth+1)
		return ps
	}
	var out []pair
	for _, m := range r.Content {
		ps, _ := c.mapping(m, path, depth+1)
		out = append(out, ps...)
	}
	return out
}

// walk visits a subtree the checks do not interpret (extension fields),
// so that its aliases are charged too.
func (c *checker) walk(n *yaml.Node, path string, depth int) {
	if n = c.node(n, path); n == nil {
		return
	}
	if depth > maxDepth {
		c.fail(path, "nested more than %d levels deep", maxDepth)
		return
	}
	for _, ch := range n.Content {
		if c.done() {
			return
		}
		c.walk(ch, path, depth+1)
	}
}

// scalar returns a non-null scalar's text. Compose would interpolate a
// "$" in it, which is refused ("$$" stays a literal "$").
func (c *checker) scalar(n *yaml.Node, path string) (string, bool) {
	if n = c.node(n, path); n == nil {
		return "", false
	}
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		c.fail(path, "must be a single value")
		return "", false
	}
	if interpolates(n.Value) {
		c.fail(path, `variable interpolation is not supported (write "$$" for a literal "$")`)
		return "", false
	}
	return n.Value, true
}

// interpolates reports whether Compose would substitute something in s.
func interpolates(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			i++
			continue
		}
		return true
	}
	return false
}

// str is a scalar matching re (nil: any), described by what.
func (c *checker) str(n *yaml.Node, path string, re *regexp.Regexp, what string) (string, bool) {
	s, ok := c.scalar(n, path)
	if ok && re != nil && !re.MatchString(s) {
		c.fail(path, "%q is not %s", clip(s), what)
		return "", false
	}
	return s, ok
}

// boolean is a YAML boolean.
func (c *checker) boolean(n *yaml.Node, path string) {
	if r := c.node(n, path); r != nil && (r.Kind != yaml.ScalarNode || r.Tag != "!!bool") {
		c.fail(path, "must be true or false")
	}
}

// integer is an integer within lo..hi.
func (c *checker) integer(n *yaml.Node, path string, lo, hi int64) (int64, bool) {
	s, ok := c.scalar(n, path)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < lo || v > hi {
		c.fail(path, "must be an integer from %d to %d", lo, hi)
		return 0, false
	}
	return v, true
}

// list returns a sequence's items (at most max).
func (c *checker) list(n *yaml.Node, path string, max int) ([]*yaml.Node, bool) {
	if n = c.node(n, path); n == nil {
		return nil, false
	}
	if n.Kind != yaml.SequenceNode {
		c.fail(path, "must be a list")
		return nil, false
	}
	if len(n.Content) > max {
		c.fail(path, "has %d entries, more than the %d allowed", len(n.Content), max)
		return nil, false
	}
	return n.Content, true
}

// strings is a list of scalars, each matching re (nil: any).
func (c *checker) strings(n *yaml.Node, path string, max int, re *regexp.Regexp, what string) []string {
	items, ok := c.list(n, path, max)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		if s, ok := c.str(it, index(path, i), re, what); ok {
			out = append(out, s)
		}
	}
	return out
}

// stringOrList is a scalar or a list of scalars (command, entrypoint).
func (c *checker) stringOrList(n *yaml.Node, path string, max int) {
	r := c.node(n, path)
	if r == nil {
		return
	}
	if r.Kind == yaml.SequenceNode {
		c.strings(n, path, max, nil, "")
		return
	}
	c.scalar(n, path)
}

// dict is a mapping of names to single values (or nothing), or a list of
// "NAME=value" entries: environment and labels.
func (c *checker) dict(n *yaml.Node, path string, max int) {
	r := c.node(n, path)
	if r == nil {
		return
	}
	if r.Kind == yaml.SequenceNode {
		for i, s := range c.strings(n, path, max, nil, "") {
			if name, _, _ := strings.Cut(s, "="); name == "" {
				c.fail(index(path, i), "must be NAME=value")
			}
		}
		return
	}
	ps, ok := c.mapping(n, path, 0)
	if !ok {
		return
	}
	if len(ps) > max {
		c.fail(path, "has %d entries, more than the %d allowed", len(ps), max)
		return
	}
	for _, p := range ps {
		if v := c.node(p.val, join(path, p.key)); v != nil && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			c.scalar(p.val, join(path, p.key))
		}
	}
}

// isNull reports whether n is an empty value ("name:" with nothing).
func (c *checker) isNull(n *yaml.Node, path string) bool {
	r := c.node(n, path)
	return r != nil && r.Kind == yaml.ScalarNode && r.Tag == "!!null"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// clip shortens a value quoted in a refusal.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
