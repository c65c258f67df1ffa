package e2e

import (
	"testing"
	"time"
)

// TestBaseImage checks, through each E2B SDK version, what users of E2B's
// base image rely on in a sandbox of the default template (baseimage.mjs):
// the user `user` with home /home/user and passwordless sudo, git, Node.js
// with npm, python3 with pip and venv, gcc/g++/make, free disk space, and
// git operations through sbx.git. The tools are checked with one SDK version
// only: they are the template's, and take minutes under TCG.
func TestBaseImage(t *testing.T) {
	eachSDK(t, sharedNode(t), sdkScenario{script: "baseimage.mjs", name: "baseimage", limit: 10 * time.Minute,
		lastEnv: []string{"AENV_BASEIMAGE_TOOLS=1"}, lastStep: "git, node, npm"})
}
