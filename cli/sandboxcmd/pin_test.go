package sandboxcmd

import (
	"strings"
	"testing"
)

// TestPinCommand: the flags are checked before any request, and the node's
// answers (a bad list, an unknown sandbox) come through with their reason.
func TestPinCommand(t *testing.T) {
	realNode(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"pin", "sb1", "--cpus", "0", "--unpin"}, "either --cpus or --unpin"},
		{[]string{"pin", "sb1", "--cpus", ""}, "--cpus needs a list"},
		{[]string{"pin", "sb1", "--cpus", "1-0"}, `part "1-0"`},
		{[]string{"pin", "sb1", "--cpus", "0"}, "sb1"},
		{[]string{"pin", "sb1"}, "sb1"},
		{[]string{"pin"}, "accepts 1 arg"},
	} {
		out, err := run(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("aenv %s: %v\n%s; want an error saying %q", strings.Join(c.args, " "), err, out, c.says)
		}
	}
}
