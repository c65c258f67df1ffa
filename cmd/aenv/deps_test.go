package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/agentenv/agentenv/"

// nodeOnly are the node's packages (and the trees under them): a client
// binary linking one of them links the VMM, networking or storage daemon.
var nodeOnly = []string{"orchestrator", "network", "vmm", "sandbox", "storage/daemon", "api"}

// nodePackages lists the packages of nodeOnly that pkgs link.
func nodePackages(t *testing.T, pkgs ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the dependencies:", err)
	}
	out, err := exec.Command(goBin, append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %v: %v", pkgs, err)
	}
	var found []string
	for _, dep := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(dep, module)
		if !ok {
			continue
		}
		for _, n := range nodeOnly {
			// "api" is the server package alone: its leaves (api/wire) are the clients'.
			if rel == n || (n != "api" && strings.HasPrefix(rel, n+"/")) {
				found = append(found, dep)
			}
		}
	}
	return found
}

// TestClientsLinkNoNode checks that the CLI and the gateway link no
// package of the node (orchestrator, network, VMM, sandbox, storage
// daemon, API server): they speak to nodes over the wire only.
func TestClientsLinkNoNode(t *testing.T) {
	if got := nodePackages(t, module+"cmd/aenv", module+"cmd/aenv-gateway"); len(got) > 0 {
		t.Fatalf("aenv and aenv-gateway link node packages: %v", got)
	}
	// The same listing of the node itself names them, so the check above
	// would see them.
	if got := nodePackages(t, module+"cmd/aenvd"); len(got) == 0 {
		t.Fatal("the listing of cmd/aenvd names no node package: the check cannot see one")
	}
}
