package compose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// canonical renders a validated document as JSON (which every YAML parser
// reads alike): aliases and merges resolved as the checks resolved them,
// extension fields (x-*, at the top and in services) and version left out, values
// typed as this parser typed them. Handing this to the guest's Compose
// rather than the file leaves no room for a file that its parser (PyYAML,
// YAML 1.1) reads otherwise than the checks did, "80:80" being a string
// here and a base-60 number there.
func canonical(root *yaml.Node) ([]byte, Errors) {
	c := &checker{budget: maxNodes, bytes: maxValueBytes}
	v, ok := c.value(root, "", 0)
	if !ok || len(c.errs) > 0 {
		if len(c.errs) == 0 {
			return nil, Errors{{Reason: "render the compose file as JSON: the document is not a mapping"}}
		}
		return nil, c.errs
	}
	top, _ := v.(map[string]any)
	dropExtensions(top)
	// Without a version Compose reads the file by the Compose
	// Specification, the one these checks follow; a version would choose
	// an older file format's schema (in which depends_on has no
	// conditions, for one).
	delete(top, "version")
	if services, ok := top["services"].(map[string]any); ok {
		for _, s := range services {
			if m, ok := s.(map[string]any); ok {
				dropExtensions(m)
			}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(top); err != nil {
		return nil, Errors{{Reason: "render the compose file as JSON: " + err.Error()}}
	}
	return asciiJSON(buf.Bytes()), nil
}

// asciiJSON escapes every non-ASCII character of a JSON text as \uXXXX
// (outside strings JSON has none). A YAML 1.1 parser takes some of them
// raw for line breaks (U+0085, U+2028) and folds them; escaped, every
// parser reads the same character.
func asciiJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, r := range string(b) {
		if r < utf8.RuneSelf {
			out = append(out, byte(r))
			continue
		}
		if r > 0xffff {
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
			continue
		}
		out = fmt.Appendf(out, `\u%04x`, r)
	}
	return out
}

func dropExtensions(m map[string]any) {
	for k := range m {
		if strings.HasPrefix(k, "x-") {
			delete(m, k)
		}
	}
}

// value converts n to JSON's values.
func (c *checker) value(n *yaml.Node, path string, depth int) (any, bool) {
	r := c.node(n, path)
	if r == nil {
		return nil, false
	}
	if depth > maxDepth {
		c.fail(path, "nested more than %d levels deep", maxDepth)
		return nil, false
	}
	switch r.Kind {
	case yaml.MappingNode:
		ps, ok := c.mapping(n, path, depth)
		if !ok {
			return nil, false
		}
		out := make(map[string]any, len(ps))
		for _, p := range ps {
			if out[p.key], ok = c.value(p.val, join(path, p.key), depth+1); !ok {
				return nil, false
			}
		}
		return out, true
	case yaml.SequenceNode:
		out := make([]any, 0, len(r.Content))
		for i, it := range r.Content {
			v, ok := c.value(it, index(path, i), depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	case yaml.ScalarNode:
		return c.scalarValue(r, path)
	}
	c.fail(path, "is not a YAML value")
	return nil, false
}

// scalarValue is a scalar as its tag says: null, boolean, number or text
// (a timestamp stays the text it was written as).
func (c *checker) scalarValue(n *yaml.Node, path string) (any, bool) {
	switch n.Tag {
	case "!!null":
		return nil, true
	case "!!str", "!!timestamp":
		return n.Value, true
	}
	var v any
	if err := n.Decode(&v); err != nil {
		c.fail(path, "%q is not a %s", clip(n.Value), strings.TrimPrefix(n.Tag, "!!"))
		return nil, false
	}
	if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
		c.fail(path, "%q is not a finite number", clip(n.Value))
		return nil, false
	}
	return v, true
}
