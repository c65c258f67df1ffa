package sandboxcmd

import (
	"strings"
	"testing"
)

// TestResizeCommand: the flag is checked before any request, and the
// node's answers (a size below the minimum, an unknown sandbox) come
// through with their reason.
func TestResizeCommand(t *testing.T) {
	realNode(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"resize", "sb1", "--memory", "0"}, "--memory needs a size"},
		{[]string{"resize", "sb1", "--memory", "64"}, "below the minimum of 128 MiB"},
		{[]string{"resize", "sb1", "--memory", "256"}, "sb1"},
		{[]string{"resize", "sb1"}, "sb1"},
		{[]string{"resize"}, "accepts 1 arg"},
	} {
		out, err := run(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("aenv %s: %v\n%s; want an error saying %q", strings.Join(c.args, " "), err, out, c.says)
		}
	}
}
