package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestVolumes runs volumes.mjs, E2B's Volume class and volumeMounts on
// create, through each SDK version; the cold resume (a boot under TCG)
// with the newest only.
func TestVolumes(t *testing.T) {
	n := sharedNode(t)
	for i, v := range sdkVersions {
		cold := i == len(sdkVersions)-1
		t.Run("sdk-"+v.version, func(t *testing.T) {
			var env []string
			if cold {
				env = append(env, "AENV_VOLUME_COLD=1")
			}
			out, err := runSDKScript(t, n, v, "volumes.mjs", 12*time.Minute, env...)
			t.Logf("volumes scenario output (SDK %s):\n%s", v.version, out)
			if err != nil {
				t.Fatalf("volumes scenario with SDK %s failed: %v\naenvd log tail:\n%s", v.version, err, tailString(n.logs(), 4000))
			}
			if !strings.Contains(out, "e2b SDK "+v.version) || !strings.Contains(out, "volumes scenario passed") {
				t.Fatalf("volumes scenario did not run to the end with SDK %s", v.version)
			}
		})
	}
}
