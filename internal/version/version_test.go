package version

import (
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	old := [3]string{version, commit, date}
	t.Cleanup(func() { version, commit, date = old[0], old[1], old[2] })

	tests := []struct {
		name             string
		v, c, d          string
		wantV            string
		wantC, wantD     string // "" means: anything but empty
		wantStringPrefix string
	}{
		{name: "stamped", v: "v1.2.3", c: "abc123", d: "2026-12-01T00:00:00Z",
			wantV: "v1.2.3", wantC: "abc123", wantD: "2026-12-01T00:00:00Z", wantStringPrefix: "v1.2.3 (commit abc123, built 2026-12-01T00:00:00Z, go"},
		{name: "unstamped", wantV: Dev, wantStringPrefix: Dev + " (commit "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			version, commit, date = tt.v, tt.c, tt.d
			got := Get()
			if got.Version != tt.wantV {
				t.Errorf("Version = %q, want %q", got.Version, tt.wantV)
			}
			if tt.wantC != "" && got.Commit != tt.wantC {
				t.Errorf("Commit = %q, want %q", got.Commit, tt.wantC)
			}
			if got.Commit == "" || got.Date == "" {
				t.Errorf("empty commit or date: %+v", got)
			}
			if tt.wantD != "" && got.Date != tt.wantD {
				t.Errorf("Date = %q, want %q", got.Date, tt.wantD)
			}
			if s := got.String(); !strings.HasPrefix(s, tt.wantStringPrefix) {
				t.Errorf("String() = %q, want prefix %q", s, tt.wantStringPrefix)
			}
		})
	}
}
