package scheduler

import "testing"

// FuzzDecodeNode feeds damaged node records (objects read from Redis) to the
// decoder: an error, never a panic.
func FuzzDecodeNode(f *testing.F) {
	f.Add([]byte{0x0a, 0x02, 'n', '1'}, "1700000000000", "up", "0")
	f.Add([]byte{0xff, 0xff}, "x", "down", "-1")
	f.Fuzz(func(t *testing.T, status []byte, last, state, pcpu string) {
		r, err := decodeNode("n", map[string]string{"status": string(status), "last": last, "state": state, "pcpu": pcpu})
		if err == nil && r.status == nil {
			t.Fatal("decoded a record without a status")
		}
	})
}
