package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/compose"
	"github.com/agentenv/agentenv/composeup"
	"github.com/agentenv/agentenv/guest/composeguest"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/sandbox"
)

// ComposeStarter pulls a project's images and starts the project in a
// sandbox's guest (composeup.Starter).
type ComposeStarter interface {
	Pull(ctx context.Context, images []string) (*composeup.Archive, error)
	Up(ctx context.Context, g composeup.Guest, a *composeup.Archive, file []byte) error
}

// CreateComposeSandbox implements ServerInterface (an aenvd extension).
// The file is validated before anything else happens to it, so a hostile
// one is refused with 400 naming its keys and no VM ever starts for it;
// then the node pulls the images (a failed pull starts nothing), creates a
// sandbox of the compose-v1 template and starts the project in it. A
// project that fails to start takes its sandbox with it.
func (s *Server) CreateComposeSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.NewComposeSandbox
	if !decodeLimit(w, r, &req, true, compose.MaxRequestBytes) {
		return
	}
	if req.Compose == "" {
		writeError(w, http.StatusBadRequest, "compose is required (the Compose file's text)")
		return
	}
	p, err := compose.Parse([]byte(req.Compose))
	if err != nil {
		var es compose.Errors
		if !errors.As(err, &es) {
			s.fail(w, r, fmt.Errorf("validate compose file: %w", err))
			return
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	timeout, ok := s.timeout(w, req.Timeout)
	if !ok {
		return
	}
	if s.refuseWhileDraining(w) {
		return
	}
	if s.opts.Compose == nil {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf(
			"compose sandboxes are not available on this node: it has no image puller for their images "+
				"(the compose file is valid: %d services, images %s)", len(p.Services), strings.Join(p.Images(), ", ")))
		return
	}
	a, err := s.opts.Compose.Pull(r.Context(), p.Images())
	if err != nil {
		code := http.StatusBadGateway // a registry's answer, or none
		if errors.Is(err, oci.ErrRefused) {
			code = http.StatusBadRequest
		}
		writeError(w, code, err.Error())
		return
	}
	defer a.Close()
	rec, err := s.o.Create(r.Context(), orchestrator.CreateOptions{
		TemplateID: composeguest.TemplateName, Timeout: timeout, Metadata: derefMap(req.Metadata)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.composeUp(r.Context(), rec, a, p.File); err != nil {
		s.log.Warn("compose project did not start: removing its sandbox", "sandbox", rec.ID, "err", err)
		if kerr := s.o.Kill(context.WithoutCancel(r.Context()), rec.ID); kerr != nil {
			s.log.Error("remove the sandbox of a compose project that did not start", "sandbox", rec.ID, "err", kerr)
		}
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("sandbox %s: %v", rec.ID, err))
		return
	}
	writeJSON(w, http.StatusCreated, s.sandbox(rec))
}

// composeUp starts the project in the running sandbox rec.
func (s *Server) composeUp(ctx context.Context, rec sandbox.Record, a *composeup.Archive, file []byte) error {
	slot, _, err := s.o.Slot(rec.ID)
	if err != nil {
		return err
	}
	return s.opts.Compose.Up(ctx, sandbox.Guest{Slot: slot, Token: rec.GuestToken}, a, file)
}
