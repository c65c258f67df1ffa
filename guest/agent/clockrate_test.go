package agent

import "testing"

// TestTickFor: the tick scales by calibration/host (a guest calibrated for
// a slower TSC than it runs on gets a shorter tick), equal frequencies get
// the nominal tick back, and ratios beyond the kernel's ±10 % are clamped.
func TestTickFor(t *testing.T) {
	for _, c := range []struct {
		calib, host int64
		tick        int64
		clamped     bool
	}{
		{2_000_000, 2_000_000, 10000, false},
		{2_000_001, 2_000_000, 10000, false}, // about 1: nominal
		{1_900_000, 2_000_000, 9500, false},  // clock ran 1/0.95 fast
		{2_100_000, 2_000_000, 10500, false}, // clock ran 0.952 slow
		{2_000_000, 2_199_000, 9095, false},
		{1_000_000, 2_000_000, 9000, true}, // twice as fast: at the bound
		{3_000_000, 2_000_000, 11000, true},
		{0, 2_000_000, 10000, false}, // unknown calibration: nominal
		{2_000_000, 0, 10000, false},
	} {
		tick, clamped := tickFor(c.calib, c.host)
		if tick != c.tick || clamped != c.clamped {
			t.Errorf("tickFor(%d, %d) = %d, %v; want %d, %v", c.calib, c.host, tick, clamped, c.tick, c.clamped)
		}
	}
}

// TestCalibratedKHz reads tsc_early_khz out of a kernel command line.
func TestCalibratedKHz(t *testing.T) {
	for cmdline, want := range map[string]int64{
		"console=ttyS0 reboot=t panic=-1 root=/dev/vda tsc_early_khz=2199998\n": 2199998,
		"tsc_early_khz=1900000 quiet":                                           1900000,
		"console=ttyS0 root=/dev/vda":                                           0,
		"tsc_early_khz=":                                                        0,
		"tsc_early_khz=-5":                                                      0,
		"xtsc_early_khz=5":                                                      0,
	} {
		if got := calibratedKHz(cmdline); got != want {
			t.Errorf("calibratedKHz(%q) = %d, want %d", cmdline, got, want)
		}
	}
}
