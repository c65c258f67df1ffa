package image

import (
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	good := []string{
		`{"lowers":[{"file":"a"},{"url":"http://127.0.0.1:1/b"}],"upper":{"data":"d","index":"i"}}`,
		`{"lowers":[],"upper":{"data":"d","sparse":true}}`,
		`{"lowers":[{"file":"/abs/a"}]}`,
	}
	for _, s := range good {
		if _, err := ParseConfig([]byte(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	bad := map[string]string{
		`{}`:              "no lowers",
		`{"lowers":[{}]}`: "exactly one",
		`{"lowers":[{"file":"a","url":"http://x"}]}`:       "exactly one",
		`{"lowers":[{"url":"ftp://x"}]}`:                   "not http",
		`{"upper":{"data":"d"}}`:                           "upper.index",
		`{"upper":{"data":"d","index":"i","sparse":true}}`: "sparse upper",
		`{"upper":{"index":"i"}}`:                          "upper.data",
		`{"lowers":[{"file":"a"}],"extra":1}`:              "unknown field",
		`{"lowers":[{"file":"a"}]} {}`:                     "trailing",
		`[1,2]`:                                            "cannot unmarshal",
		`{"lowers":[` + strings.Repeat(`{"file":"a"},`, 255) + `{"file":"a"}]}`: "at most 255",
	}
	for s, want := range bad {
		_, err := ParseConfig([]byte(s))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: error %v, want one mentioning %q", s, err, want)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"lowers":[{"file":"a"}],"upper":{"data":"d","index":"i"}}`))
	f.Add([]byte(`{"lowers":[{"url":"https://h/v2/x/blobs/sha256:00"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config fails validation: %v", err)
		}
	})
}
