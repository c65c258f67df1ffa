// Package agentbench measures aenv-agent against references run in the same
// process: the cost of starting a command through the agent (Connect
// Process.Start over loopback HTTP, until the end event) as a ratio to a bare
// fork/exec of /bin/true, and /files upload and download throughput as a ratio
// to a local file-to-file copy. Run it with `make bench` or
// `go test -run '^$' -bench . -benchtime 1x ./bench/agent`.
package agentbench
