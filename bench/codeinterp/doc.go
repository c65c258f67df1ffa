// Package codeinterpbench measures E2B's Code Interpreter SDK against the
// base SDK's commands in the same sandbox and run: the round trip of
// runCode("1+1") (the proxy, the port-49999 server, a Jupyter kernel) as a
// ratio to commands.run("true") (the proxy, the agent, a process), and the
// create of a code-interpreter-v1 sandbox (once the node has built the
// template) as a ratio to a create from base. Run it with `make bench` or
// `go test -run '^$' -bench . -benchtime 1x ./bench/codeinterp` (root;
// boots VMs: under the shared VM lock on a shared machine; the template's
// first build takes minutes under emulation and is not measured).
package codeinterpbench
