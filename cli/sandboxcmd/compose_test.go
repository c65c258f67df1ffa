package sandboxcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/compose"
)

// TestComposeUp: against a real node's handler, a hostile file comes back
// refused with the key path, a valid one with the node's reason it cannot
// run it, and the file's own problems are caught before any request.
func TestComposeUp(t *testing.T) {
	realNode(t)
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hostile := write("hostile.yaml", "services:\n  web:\n    image: alpine\n    cap_add: [SYS_ADMIN]\n")
	valid := write("valid.yaml", "services:\n  web: {image: alpine, networks: [n]}\n  db: {image: postgres, networks: [n]}\nnetworks: {n: }\n")
	big := write("big.yaml", strings.Repeat("#", compose.MaxFileBytes+1))
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"compose", "up", "-f", hostile}, "services.web.cap_add: adding capabilities is not allowed"},
		{[]string{"compose", "up", "-f", valid}, "no image puller"},
		{[]string{"compose", "up", "-f", big}, "larger than"},
		{[]string{"compose", "up", "-f", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"compose", "up"}, "-f FILE is required"},
	} {
		out, err := run(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("aenv %s: %v\n%s; want an error saying %q", strings.Join(c.args, " "), err, out, c.says)
		}
	}
}
