// Package compose validates the Docker Compose files of compose sandboxes
// on the node, before any VM starts: an image-only project of 1 to
// MaxServices services in a file of at most MaxFileBytes, whose services
// cannot reach out of their containers (no privileged mode, added
// capabilities, devices, host bind mounts or host namespaces).
//
// The rules are an allow-list: every top-level and service key the
// package does not know is refused, so a Compose feature added later is
// refused until it is reviewed here. The keys allowed are those of the
// Compose Specification that Debian's Compose (docker-compose 1.29 in
// bookworm, the guest's suite) also runs, so a file valid here is one the
// guest's Compose takes. Each refusal names the key path
// (services.web.privileged). Variable interpolation (${VAR}) is refused
// too: the validated file must be the file Compose runs, not one whose
// values the guest's environment rewrites ("$$" is a literal "$").
//
// Parsing is bounded before it starts: the file's size, and the number of
// bytes that can open a YAML node (which bounds the parser's allocation);
// the checked tree is walked with a node budget that counts every alias
// expansion, so a YAML alias bomb is refused, not expanded.
package compose

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Limits.
const (
	// MaxFileBytes bounds a Compose file.
	MaxFileBytes = 1 << 20
	// MaxRequestBytes bounds a request carrying a file of MaxFileBytes as
	// a JSON string, escapes included ("\u0009" is six bytes for one), and
	// the request's other fields: what the node and the gateway read of
	// POST /sandboxes-compose.
	MaxRequestBytes = 6*MaxFileBytes + 64<<10
	// MaxServices bounds a project's services (and MinServices is 1).
	MaxServices = 24
	// maxStructure bounds the bytes that can start a YAML node or entry
	// (",-:?[{" and newlines). The parser allocates a few hundred bytes
	// per node, so this, not the file size, is what bounds its memory.
	maxStructure = 64 << 10
	// maxNodes bounds the nodes the checks visit, every expansion of an
	// alias counted again.
	maxNodes = 100_000
	// maxValueBytes bounds the bytes of the scalars the checks visit, every
	// expansion of an alias counted again: it bounds their work (a value
	// is matched against a pattern) and the size of Project.File.
	maxValueBytes = 8 << 20
	// maxDepth bounds nesting as the checks see it (aliases followed).
	maxDepth = 32
	// maxErrors bounds the refusals one answer lists.
	maxErrors = 20
)

// Project is a validated Compose project: what the node needs from it to
// start it (the images it pulls), the file itself being what the guest
// runs.
type Project struct {
	// Services are in the file's order.
	Services []Service
	// File is the validated file as JSON (a YAML document too): aliases
	// and merges resolved, extension fields and version left out. It is what a guest
	// should run, not the original, so that Compose's own YAML parser
	// cannot read the file otherwise than these checks did.
	File []byte
}

// Service is one validated service.
type Service struct {
	Name  string
	Image string
	// Ports are the container ports the service publishes (long and short
	// syntax), in the file's order.
	Ports []string
}

// Images returns the project's distinct images in the order first used.
func (p *Project) Images() []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range p.Services {
		if !seen[s.Image] {
			seen[s.Image] = true
			out = append(out, s.Image)
		}
	}
	return out
}

// Error is one refusal: the key path it is about ("" for the file as a
// whole) and why.
type Error struct {
	Path   string
	Reason string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return e.Path + ": " + e.Reason
}

// Errors are the refusals of one file, in the order found (at most
// maxErrors; the checks stop there).
type Errors []*Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return "compose file refused: " + strings.Join(parts, "; ")
}

// Paths returns the key paths of the refusals, for callers that match on
// them.
func (es Errors) Paths() []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Path
	}
	return out
}

// Parse validates a Compose file and returns its project, or Errors
// naming every offending key (up to a bound).
func Parse(data []byte) (*Project, error) {
	if len(data) == 0 {
		return nil, Errors{{Reason: "the compose file is empty"}}
	}
	if len(data) > MaxFileBytes {
		return nil, Errors{{Reason: fmt.Sprintf("the compose file is %d bytes, more than the %d allowed", len(data), MaxFileBytes)}}
	}
	if n := structureBytes(data); n > maxStructure {
		return nil, Errors{{Reason: fmt.Sprintf("the compose file has %d structural YAML characters, more than the %d allowed", n, maxStructure)}}
	}
	root, err := decodeOne(data)
	if err != nil {
		return nil, Errors{{Reason: err.Error()}}
	}
	c := &checker{budget: maxNodes, bytes: maxValueBytes}
	p := c.project(root)
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	file, errs := canonical(root)
	if len(errs) > 0 {
		return nil, errs
	}
	p.File = file
	return p, nil
}

// structureBytes counts the bytes that can begin a node or an entry.
func structureBytes(data []byte) int {
	n := 0
	for _, b := range data {
		switch b {
		case ',', '-', ':', '?', '[', '{', '\n':
			n++
		}
	}
	return n
}

// decodeOne parses the file's one document: a second document would be
// seen by Compose and not by these checks.
func decodeOne(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the compose file has no YAML document")
		}
		return nil, fmt.Errorf("the compose file is not valid YAML: %w", err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, errors.New("the compose file holds more than one YAML document")
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, errors.New("the compose file has no YAML document")
	}
	return doc.Content[0], nil
}
