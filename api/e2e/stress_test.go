package e2e

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestLifecycleStress runs rounds of concurrent sandbox lives through E2B's
// SDK (stress.mjs): creates, command streams right after a create and after
// a pause and connect, kills. It is how a cut agent stream or a slot handed
// to two sandboxes at once shows itself. AENV_STRESS_ROUNDS sets the rounds.
func TestLifecycleStress(t *testing.T) {
	n := sharedNode(t)
	v := sdkVersions[len(sdkVersions)-1]
	rounds := os.Getenv("AENV_STRESS_ROUNDS")
	if rounds == "" {
		rounds = "2"
	}
	out, err := runSDKScript(t, n, v, "stress.mjs", 15*time.Minute, "AENV_STRESS_ROUNDS="+rounds)
	t.Logf("stress output:\n%s", out)
	if err != nil || !strings.Contains(out, "stress passed") {
		t.Fatalf("stress failed: %v\naenvd log tail:\n%s", err, tailString(n.logs(), 8000))
	}
}
