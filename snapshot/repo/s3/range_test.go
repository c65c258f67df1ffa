package s3

import "testing"

// TestCheckRange: a ranged answer is accepted only for the range asked (or
// its part up to the object's end); anything else is an error.
func TestCheckRange(t *testing.T) {
	cases := []struct {
		cr     string
		off, n int64
		ok     bool
	}{
		{"bytes 0-9/100", 0, 10, true},
		{"bytes 90-99/100", 90, 20, true}, // short at the end
		{"bytes 10-99/100", 10, -1, true},
		{"bytes 1-10/100", 0, 10, false},
		{"bytes 0-8/100", 0, 10, false},
		{"bytes 10-50/100", 10, -1, false},
		{"bytes 0-9/*", 0, 10, true},
		{"", 0, 10, false},
		{"bytes 0-9/5", 0, 10, false},
	}
	for _, c := range cases {
		if err := checkRange(c.cr, c.off, c.n); (err == nil) != c.ok {
			t.Errorf("checkRange(%q, %d, %d) = %v, want ok=%v", c.cr, c.off, c.n, err, c.ok)
		}
	}
}
