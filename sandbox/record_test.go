package sandbox

import "testing"

// TestRecordDevices: a record's devices are its root disk's and its
// drives', and ClearDevices forgets them all.
func TestRecordDevices(t *testing.T) {
	r := Record{Device: 7, HasDevice: true, Drives: []AttachedDrive{{Device: 8, HasDevice: true}, {}, {Device: 9, HasDevice: true}}}
	if got := r.Devices(); len(got) != 3 || got[0] != 7 || got[1] != 8 || got[2] != 9 {
		t.Fatalf("devices %v", got)
	}
	r.ClearDevices()
	if got := r.Devices(); len(got) != 0 || r.Drives[2].Device != 0 {
		t.Fatalf("after clearDevices: %v %+v", got, r)
	}
}
