package blob

import "testing"

func FuzzParseBearer(f *testing.F) {
	f.Add(`Bearer realm="https://auth/token",service="reg",scope="repository:a/b:pull,push"`)
	f.Add(`Bearer realm=x,service=y`)
	f.Add(`Bearer realm="unterminated`)
	f.Fuzz(func(t *testing.T, s string) {
		parseBearer(s)
	})
}

func FuzzTotalSize(f *testing.F) {
	f.Add("bytes 0-0/1234")
	f.Add("bytes */10")
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := totalSize(s); err == nil && n < 0 {
			t.Fatalf("negative size %d from %q", n, s)
		}
	})
}
