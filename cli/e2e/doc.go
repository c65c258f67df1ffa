// Package e2e drives the aenv binary against a real aenvd with real QEMU
// VMs: every node command's output (table and JSON) and exit status, and the
// interactive terminal through tmux. One aenvd serves the whole package.
package e2e
