// Package variants names the root filesystem variants of the node's
// builtin templates, for whatever builds one by name (aenvd's template
// builds, `aenv guest build --variant`).
package variants

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agentenv/agentenv/guest/codeinterp"
	"github.com/agentenv/agentenv/guest/composeguest"
	"github.com/agentenv/agentenv/guest/image"
)

var all = map[string]func() image.Variant{
	codeinterp.TemplateName:   codeinterp.Variant,
	composeguest.TemplateName: composeguest.Variant,
}

// Names lists the known variants, sorted.
func Names() []string { return slices.Sorted(maps.Keys(all)) }

// Lookup returns the variant called name, or an error naming the known ones.
func Lookup(name string) (image.Variant, error) {
	v, ok := all[name]
	if !ok {
		return image.Variant{}, fmt.Errorf("unknown root filesystem variant %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return v(), nil
}
