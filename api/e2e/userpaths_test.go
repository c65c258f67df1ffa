package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestE2BUserPaths runs userpaths.mjs (what a new user tries with the SDK
// on one node: signed file URLs fetched as they are, a sandbox server
// through sbx.getHost, a PTY reconnect, a timer across a pause) with the
// newest SDK. Its getHost step needs *.localhost to resolve to loopback
// (.ci/setup.d/65-localhost-names.sh).
func TestE2BUserPaths(t *testing.T) {
	n := sharedNode(t)
	v := sdkVersions[len(sdkVersions)-1]
	out, err := runSDKScript(t, n, v, "userpaths.mjs", 4*time.Minute)
	t.Logf("userpaths output (SDK %s):\n%s", v.version, out)
	if err != nil {
		t.Fatalf("userpaths with SDK %s failed: %v\naenvd log tail:\n%s", v.version, err, tailString(n.logs(), 4000))
	}
	if !strings.Contains(out, "userpaths scenario passed") {
		t.Fatalf("userpaths did not run to the end with SDK %s", v.version)
	}
}
