package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/compose"
)

// maxComposeBody bounds POST /sandboxes-compose's body: a Compose file of
// compose.MaxFileBytes as a JSON string, escapes included ("\u0009" is six
// bytes for one), and the other fields.
const maxComposeBody = 6*compose.MaxFileBytes + 64<<10

// CreateComposeSandbox implements ServerInterface (an aenvd extension).
// The file is validated before anything else happens to it, so a hostile
// one is refused with 400 naming its keys and no VM ever starts for it.
func (s *Server) CreateComposeSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.NewComposeSandbox
	if !decodeLimit(w, r, &req, true, maxComposeBody) {
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
	if _, ok := s.timeout(w, req.Timeout); !ok {
		return
	}
	if s.refuseWhileDraining(w) {
		return
	}
	// Starting the project needs a template whose guest runs Docker
	// Engine and Compose, and the images pulled by the node and handed to
	// it; neither exists yet (docs/compose.md), so a valid file is told
	// so rather than answered by a sandbox that would not run it.
	writeError(w, http.StatusNotImplemented, fmt.Sprintf(
		"compose sandboxes are not available on this node: it has no template with Docker Engine and Compose "+
			"(the compose file is valid: %d services, images %s)", len(p.Services), strings.Join(p.Images(), ", ")))
}
