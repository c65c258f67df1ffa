package agent

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/state"
)

// errToken is the error of a request without the access token.
var errToken = errors.New("invalid or missing access token")

// tokenInterceptor enforces the access token on every RPC. Doing it inside
// Connect (rather than in HTTP middleware) lets each protocol — Connect,
// gRPC, gRPC-Web — carry the unauthenticated code in its own way.
type tokenInterceptor struct{ st *state.State }

func (ti tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !ti.st.TokenOK(req.Header()) {
			return nil, connect.NewError(connect.CodeUnauthenticated, errToken)
		}
		return next(ctx, req)
	}
}

func (ti tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (ti tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !ti.st.TokenOK(conn.RequestHeader()) {
			return connect.NewError(connect.CodeUnauthenticated, errToken)
		}
		return next(ctx, conn)
	}
}

// rpcPath reports whether path belongs to a Connect service (guarded by tokenInterceptor).
func rpcPath(path string) bool {
	return strings.HasPrefix(path, "/process.Process/") || strings.HasPrefix(path, "/filesystem.Filesystem/")
}

// tokenExempt lists the paths that check credentials themselves (/files,
// /init, the RPCs) or need none (/health).
func tokenExempt(path string) bool {
	switch path {
	case "/health", "/files", "/init":
		return true
	}
	return rpcPath(path)
}

func unauthorized(w http.ResponseWriter) {
	WriteError(w, http.StatusUnauthorized, errToken.Error())
}
