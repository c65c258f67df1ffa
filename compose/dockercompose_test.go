package compose

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAcceptedFilesRunWithDebianCompose: the files these tests accept are
// accepted by Compose itself (docker-compose config parses and validates
// a file without a Docker daemon), the Debian package the guest would run.
func TestAcceptedFilesRunWithDebianCompose(t *testing.T) {
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose is not installed (.ci/setup.d/50-deploy.sh installs Debian's)")
	}
	dir := t.TempDir()
	for name, file := range map[string]string{"two-services": twoServices, "allowed-keys": allowedKeys, "more-keys": moreKeys} {
		if _, err := Parse([]byte(file)); err != nil {
			t.Fatalf("%s: Parse: %v", name, err)
		}
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(t.Context(), bin, "-f", p, "config", "--quiet")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: docker-compose config: %v\n%s", name, err, out)
		}
	}
}
