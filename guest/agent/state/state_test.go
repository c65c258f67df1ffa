package state_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

func TestBasicUser(t *testing.T) {
	t.Parallel()
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		header  string
		name    string
		ok, err bool
	}{
		{"", "", false, false},
		{"Basic " + b64("user:"), "user", true, false},
		{"basic " + b64("root:ignored"), "root", true, false},
		{"Basic " + b64(":"), "", false, false},
		{"Bearer abc", "", false, false},
		{"Basic !!!", "", false, true},
	}
	for _, tc := range tests {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Authorization", tc.header)
		}
		name, ok, err := state.BasicUser(h)
		if name != tc.name || ok != tc.ok || (err != nil) != tc.err {
			t.Errorf("%q: got %q %v %v", tc.header, name, ok, err)
		}
	}
}

func TestResolvePath(t *testing.T) {
	t.Parallel()
	u := &users.User{Name: "user", Home: "/home/user"}
	tests := map[string]string{
		"/abs/x":      "/abs/x",
		"rel.txt":     "/home/user/rel.txt",
		"~":           "/home/user",
		"~/a/../b":    "/home/user/b",
		"/a/./b/../c": "/a/c",
		"../escape":   "/home/escape",
	}
	for in, want := range tests {
		got, err := state.ResolvePath(u, in)
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := state.ResolvePath(u, ""); err == nil {
		t.Error("empty path accepted")
	}
	if got, _ := state.ResolvePath(&users.User{}, "x"); got != "/x" {
		t.Errorf("user without home: %q", got)
	}
}

func TestTokenOK(t *testing.T) {
	t.Parallel()
	st := state.New(&users.DB{}, "")
	if !st.TokenOK(http.Header{}) {
		t.Fatal("no token set must allow")
	}
	tok := "t"
	st.Apply(state.Settings{AccessToken: &tok})
	h := http.Header{}
	if st.TokenOK(h) {
		t.Fatal("missing header allowed")
	}
	h.Set(state.AccessTokenHeader, "t")
	if !st.TokenOK(h) {
		t.Fatal("right token refused")
	}
}

func FuzzBasicUser(f *testing.F) {
	f.Add("Basic dXNlcjo=")
	f.Add("Basic ")
	f.Add("x")
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set("Authorization", v)
		name, ok, _ := state.BasicUser(h)
		if ok && (name == "" || strings.Contains(name, ":")) {
			t.Fatalf("bad name %q", name)
		}
	})
}

func FuzzResolvePath(f *testing.F) {
	f.Add("a/b")
	f.Add("~/../..")
	f.Add("/x//y/")
	f.Fuzz(func(t *testing.T, p string) {
		got, err := state.ResolvePath(&users.User{Home: "/home/u"}, p)
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("%q resolved to %q", p, got)
		}
	})
}

func TestDefaultUserFallback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := &users.DB{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
	write := func(s string) {
		if err := os.WriteFile(db.PasswdPath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n")
	st := state.New(db, "")
	if u, err := st.User(""); err != nil || u.Name != "user" {
		t.Fatalf("with a template user: %+v %v", u, err)
	}
	root := "root"
	st.Apply(state.Settings{DefaultUser: &root})
	if u, err := st.User(""); err != nil || u.Name != "root" {
		t.Fatalf("after /init defaultUser: %+v %v", u, err)
	}
	write(fmt.Sprintf("me:x:%d:%d::/somewhere:/bin/sh\n", os.Getuid(), os.Getgid()))
	if u, err := state.New(db, "").User(""); err != nil || u.UID != uint32(os.Getuid()) {
		t.Fatalf("without a template user: %+v %v", u, err)
	}
}
