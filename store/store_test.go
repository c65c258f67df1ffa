package store

import (
	"errors"
	"path/filepath"
	"testing"
)

type rec struct {
	ID    string
	State string
	Meta  map[string]string
}

func TestPutGetListDeleteReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []rec{{"b", "paused", nil}, {"a", "running", map[string]string{"k": "v"}}} {
		if err := s.Put(Sandboxes, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	var got rec
	if err := s.Get(Sandboxes, "a", &got); err != nil || got.Meta["k"] != "v" {
		t.Fatalf("get a: %+v %v", got, err)
	}
	if err := s.Get(Templates, "a", &got); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get in another bucket: %v, want ErrNotFound", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all, err := ListAll[rec](s, Sandboxes)
	if err != nil || len(all) != 2 || all[0].ID != "a" || all[1].State != "paused" {
		t.Fatalf("after reopen: %+v %v", all, err)
	}
	if err := s.Delete(Sandboxes, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(Sandboxes, "a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := s.Get(Sandboxes, "a", &got); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted record still there: %v", err)
	}
	if err := s.Put("nope", "x", rec{}); err == nil {
		t.Fatal("put into an unknown bucket succeeded")
	}
}
