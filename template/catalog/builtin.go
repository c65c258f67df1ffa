package catalog

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agentenv/agentenv/guest/codeinterp"
	"github.com/agentenv/agentenv/guest/composeguest"
	"github.com/agentenv/agentenv/template"
)

// Builtin templates are the node's own besides the default one, listed
// from the node's start with a build waiting, and built on the node on
// first use (a create that names one, `aenv start NAME`)
// through the template builder: a build from a root filesystem variant of
// the guest image, its start and ready commands. Their builds are listed,
// logged and failed like any other; a failed build is tried again by the
// next use.
type builtin struct {
	spec template.BuildSpec
	// minMemoryMiB is the least memory the template's VM gets.
	minMemoryMiB int
}

var builtins = map[string]builtin{
	codeinterp.TemplateName: {
		spec: template.BuildSpec{FromRootfs: codeinterp.TemplateName, StartCmd: codeinterp.StartCmd,
			ReadyCmd: codeinterp.ReadyCmd, ReadyTimeout: codeinterp.ReadyTimeout},
		minMemoryMiB: 1024,
	},
	composeguest.TemplateName: {
		spec: template.BuildSpec{FromRootfs: composeguest.TemplateName, StartCmd: composeguest.StartCmd,
			ReadyCmd: composeguest.ReadyCmd, ReadyTimeout: composeguest.ReadyTimeout, RootCommands: true},
		minMemoryMiB: composeguest.MinMemoryMiB,
	},
}

// IsBuiltin reports whether name is one of the node's builtin templates.
func IsBuiltin(name string) bool { _, ok := builtins[name]; return ok }

// builtinPoll is how often EnsureBuiltin looks at a running build.
const builtinPoll = 2 * time.Second

// EnsureBuiltin makes sure the builtin template name is ready, starting
// its build when it has none ready or running, and waits for the build
// (bounded by ctx). Nothing to do for any other name, or without builds.
func (c *Catalog) EnsureBuiltin(ctx context.Context, name string) error {
	bi, ok := builtins[name]
	if !ok {
		return nil
	}
	b, err := c.Builder()
	if err != nil {
		return nil // no builds here: the create fails on the missing template
	}
	c.builtinMu.Lock()
	t, known := b.Resolve(name)
	if known && t.Ready() && t.Snapshot != "" {
		c.builtinMu.Unlock()
		return nil
	}
	buildID := ""
	if known {
		buildID, err = c.joinBuiltin(b, t, bi)
	}
	if buildID == "" && err == nil {
		t, buildID, err = c.startBuiltin(b, name, bi)
	}
	c.builtinMu.Unlock()
	if err != nil {
		return err
	}
	return c.waitBuild(ctx, b, t.ID, buildID)
}

// joinBuiltin returns the build of t a use waits for: its latest build
// when that is running, or when it is the one registerBuiltins left
// waiting (started now); "" when a new build is needed.
func (c *Catalog) joinBuiltin(b *template.Builder, t template.Template, bi builtin) (string, error) {
	br := t.Builds[t.LatestBuild]
	switch {
	case br == nil:
		return "", nil
	case br.Spec != nil && (br.Status == template.BuildBuilding || br.Status == template.BuildWaiting):
		return br.ID, nil
	case br.Spec == nil && br.Status == template.BuildWaiting:
		c.log.Info("building the node's template on first use", "template", t.ID)
		if err := b.Start(t.ID, br.ID, bi.spec); err != nil {
			return "", fmt.Errorf("template %s: start its build: %w", t.ID, err)
		}
		return br.ID, nil
	}
	return "", nil
}

// registerBuiltins lists every builtin template the node has no record of
// with a build waiting for its first use (EnableBuilds), so that
// `aenv template list` and GET /templates show it before anyone used it.
func (c *Catalog) registerBuiltins(b *template.Builder) {
	c.builtinMu.Lock()
	defer c.builtinMu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(builtins)) {
		if _, known := b.Resolve(name); known {
			continue
		}
		bi := builtins[name]
		if _, _, err := b.Create(c.builtinRequest(name, bi)); err != nil {
			c.log.Warn("builtin template not listed until its first use", "template", name, "err", err)
		}
	}
}

func (c *Catalog) builtinRequest(name string, bi builtin) template.Request {
	return template.Request{Name: name, VCPUs: c.cfg.VCPUs, MemoryMiB: max(c.cfg.MemoryMiB, bi.minMemoryMiB)}
}

func (c *Catalog) startBuiltin(b *template.Builder, name string, bi builtin) (template.Template, string, error) {
	c.log.Info("building the node's template on first use", "template", name)
	t, buildID, err := b.Create(c.builtinRequest(name, bi))
	if err != nil {
		return t, "", fmt.Errorf("template %s: register its build: %w", name, err)
	}
	if err := b.Start(t.ID, buildID, bi.spec); err != nil {
		return t, "", fmt.Errorf("template %s: start its build: %w", name, err)
	}
	return t, buildID, nil
}

// waitBuild waits for a build to end: nil once ready, its reason if failed.
func (c *Catalog) waitBuild(ctx context.Context, b *template.Builder, templateID, buildID string) error {
	for {
		st, err := b.Status(templateID, buildID, 0, 0, "")
		if err != nil {
			return fmt.Errorf("template %s: build %s: %w", templateID, buildID, err)
		}
		switch st.Status {
		case template.BuildReady:
			return nil
		case template.BuildError:
			return fmt.Errorf("template %s: its build %s on this node failed (step %s): %s", templateID, buildID, st.ReasonStep, st.Reason)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("template %s: waiting for its build %s: %w", templateID, buildID, ctx.Err())
		case <-time.After(builtinPoll):
		}
	}
}
