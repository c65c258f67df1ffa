package users_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/guest/agent/users"
)

func TestParsePasswd(t *testing.T) {
	t.Parallel()
	in := `# comment
root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:User,,,:/home/user:/bin/bash

bad-uid:x:abc:0::/:/bin/sh
short:x:1:1
:x:5:5::/:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`
	got, err := users.ParsePasswd(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []users.PasswdEntry{
		{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/bash"},
		{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash"},
		{Name: "nobody", UID: 65534, GID: 65534, Home: "/nonexistent", Shell: "/usr/sbin/nologin"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseGroup(t *testing.T) {
	t.Parallel()
	got, err := users.ParseGroup(strings.NewReader("root:x:0:\nsudo:x:27:user, other\nbad:x:nope:user\nshort:x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Name != "sudo" || got[1].GID != 27 || !slices.Equal(got[1].Members, []string{"user", "other"}) {
		t.Fatalf("got %+v", got)
	}
}

func TestLongLineIsAnError(t *testing.T) {
	t.Parallel()
	if _, err := users.ParsePasswd(strings.NewReader(strings.Repeat("a", 100<<10))); err == nil {
		t.Fatal("a 100 KiB line was accepted")
	}
}

func TestDBLookupAndReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := &users.DB{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd", "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n")
	write("group", "user:x:1000:\nsudo:x:27:user\ndocker:x:999:other,user\n")
	u, err := db.Lookup("user")
	if err != nil {
		t.Fatal(err)
	}
	if u.UID != 1000 || u.Home != "/home/user" || !slices.Equal(u.Groups, []uint32{1000, 27, 999}) {
		t.Fatalf("user %+v", u)
	}
	if _, err := db.Lookup("ghost"); err == nil {
		t.Fatal("ghost found")
	}
	if db.UserName(1000) != "user" || db.UserName(4242) != "4242" || db.GroupName(27) != "sudo" || db.GroupName(4242) != "4242" {
		t.Fatal("name lookups wrong")
	}
	// A user added later is found without restarting (size changes the stamp).
	write("passwd", "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\nghost:x:1001:1001::/home/ghost:/bin/sh\n")
	if u, err := db.Lookup("ghost"); err != nil || u.UID != 1001 {
		t.Fatalf("added user: %+v %v", u, err)
	}
	missing := &users.DB{PasswdPath: filepath.Join(dir, "none"), GroupPath: filepath.Join(dir, "none")}
	if _, err := missing.Lookup("root"); err == nil {
		t.Fatal("lookup without a passwd file succeeded")
	}
}

func FuzzParsePasswd(f *testing.F) {
	f.Add("root:x:0:0:root:/root:/bin/bash\n")
	f.Add("a:b:99999999999:1:::\n#x\n\n")
	f.Add(":::::::\n")
	f.Fuzz(func(t *testing.T, s string) {
		es, err := users.ParsePasswd(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, e := range es {
			if e.Name == "" || strings.Contains(e.Name, ":") || strings.Contains(e.Name, "\n") {
				t.Fatalf("bad entry %+v", e)
			}
		}
	})
}

func FuzzParseGroup(f *testing.F) {
	f.Add("sudo:x:27:user,other\n")
	f.Add("g::1:,,,\n")
	f.Fuzz(func(t *testing.T, s string) {
		gs, err := users.ParseGroup(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, g := range gs {
			for _, m := range g.Members {
				if m == "" || strings.Contains(m, ",") {
					t.Fatalf("bad member %q", m)
				}
			}
		}
	})
}
