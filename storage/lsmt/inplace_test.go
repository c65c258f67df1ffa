package lsmt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSealInPlaceRejectsMappingsOutsideTheData: a mapping into the header,
// past the data end or zeroed is refused before anything is written.
func TestSealInPlaceRejectsMappingsOutsideTheData(t *testing.T) {
	const end = HeaderSize + 64*SectorSize
	for _, s := range []Segment{
		{Offset: 0, MOffset: 0, Length: 8},                        // the header
		{Offset: 0, MOffset: HeaderSize / SectorSize, Length: 65}, // past the end
		{Offset: 0, MOffset: HeaderSize / SectorSize, Length: 8, Zeroed: true},
	} {
		f, err := os.Create(filepath.Join(t.TempDir(), "l"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = SealInPlace(f, end, []Segment{s}, SealOptions{VirtualSize: 1 << 20})
		if err == nil || !strings.Contains(err.Error(), "outside the data") {
			t.Errorf("SealInPlace with %+v: %v, want outside the data", s, err)
		}
		if st, _ := f.Stat(); st.Size() != 0 {
			t.Errorf("SealInPlace with %+v wrote %d bytes", s, st.Size())
		}
		f.Close()
	}
	f, _ := os.Create(filepath.Join(t.TempDir(), "l"))
	defer f.Close()
	if _, err := SealInPlace(f, end+1, nil, SealOptions{}); err == nil {
		t.Errorf("SealInPlace with an unaligned data end: no error")
	}
}
