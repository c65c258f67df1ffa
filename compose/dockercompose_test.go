package compose

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestAcceptedFilesRunWithDebianCompose: the files these tests accept are
// accepted by Compose itself (docker-compose config parses and validates
// a file without a Docker daemon), the Debian package the guest would run,
// and so is each one's Project.File, which Compose reads as the same
// project (its config output is the same).
func TestAcceptedFilesRunWithDebianCompose(t *testing.T) {
	bin := testenv.RequireTool(t, "docker-compose", ".ci/setup.d/50-deploy.sh installs Debian's")
	dir := t.TempDir()
	for name, file := range map[string]string{"two-services": twoServices, "allowed-keys": allowedKeys, "more-keys": moreKeys} {
		p, err := Parse([]byte(file))
		if err != nil {
			t.Fatalf("%s: Parse: %v", name, err)
		}
		orig := composeConfig(t, bin, filepath.Join(dir, name+".yaml"), file)
		canon := composeConfig(t, bin, filepath.Join(dir, name+".json"), string(p.File))
		// Project.File leaves extension fields (single-line ones here)
		// and the version out (config prints the one it read by).
		orig = strings.TrimSpace(leftOut.ReplaceAllString(orig, ""))
		if canon = strings.TrimSpace(leftOut.ReplaceAllString(canon, "")); orig != canon {
			t.Errorf("%s: Compose reads Project.File otherwise than the file:\n%s\nversus\n%s", name, orig, canon)
		}
	}
}

var leftOut = regexp.MustCompile(`(?m)^( *x-[a-z-]+|version): .*\n`)

// composeConfig is docker-compose config's rendering of a file (the
// project name fixed: it comes from the directory otherwise).
func composeConfig(t *testing.T, bin, path, file string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "-p", "check", "-f", path, "config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Dir(path)}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("docker-compose config of %s: %v\n%s", filepath.Base(path), err, stderr.String())
	}
	return string(out)
}
