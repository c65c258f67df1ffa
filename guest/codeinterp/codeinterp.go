// Package codeinterp is the code-interpreter-v1 template: what E2B's Code
// Interpreter SDK (@e2b/code-interpreter) starts by default. Its root
// filesystem is the node's default one plus Debian's Jupyter stack
// (ipykernel, jupyter_client) with numpy, pandas and matplotlib, and
// server.py: the server on port 49999 the SDK talks to (POST /execute
// streaming JSON lines; /contexts to create, list, restart and remove
// contexts), each Python context a Jupyter kernel of its own. The template
// is built on the node (template package) from Variant, with StartCmd
// starting the server and ReadyCmd waiting for its default kernel.
package codeinterp

import (
	_ "embed"
	"time"

	"github.com/agentenv/agentenv/guest/image"
)

// TemplateName is the template's id and name (the SDK's default template).
const TemplateName = "code-interpreter-v1"

// Port is where the server listens in the guest (the SDK's JUPYTER_PORT).
const Port = 49999

// ServerPath is where the server is installed in the root filesystem.
const ServerPath = "/usr/lib/aenv/code-interpreter/server.py"

//go:embed server.py
var server []byte

// Packages are the Debian packages the variant adds to the default root
// filesystem (which already has python3, Node.js and bash).
var Packages = []string{"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib-inline",
	"python3-matplotlib", "python3-pandas", "python3-numpy"}

// StartCmd starts the server in the background of the build VM (it is in
// the snapshot, its default kernel warm); its log goes to /tmp.
const StartCmd = "exec /usr/bin/python3 " + ServerPath + " >/tmp/code-interpreter.log 2>&1"

// ReadyCmd succeeds once the server answers and its default Python kernel
// is ready.
const ReadyCmd = "curl -sf http://127.0.0.1:49999/health"

// ReadyTimeout bounds the build's wait for ReadyCmd: the first start of a
// kernel, with matplotlib imported, takes minutes under emulation.
const ReadyTimeout = 20 * time.Minute

// Variant is the template's root filesystem variant.
func Variant() image.Variant {
	return image.Variant{Name: TemplateName, Packages: Packages,
		Files: map[string]image.File{ServerPath: {Data: server, Mode: 0o755}}}
}
