package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestTemplatesFallback: servers without /v2/templates are listed through
// /templates.
func TestTemplatesFallback(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/templates" {
			w.WriteHeader(404)
			fmt.Fprintf(w, `{"code":404,"message":"no route %s"}`, r.URL.Path)
			return
		}
		fmt.Fprint(w, `[{"templateID":"base","aliases":["base"]}]`)
	}))
	defer srv.Close()
	ts, err := New(srv.URL, "k").Templates(context.Background())
	if err != nil || len(ts) != 1 || ts[0].TemplateID != "base" {
		t.Fatalf("templates: %+v %v", ts, err)
	}
}

// TestUploadTemplateFiles: the key goes to the node's own upload route and
// never to another host; a relative or empty link means the node's route.
func TestUploadTemplateFiles(t *testing.T) {
	t.Parallel()
	type got struct{ path, key, body, ctype string }
	rec := func(ch chan got) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			ch <- got{r.URL.Path, r.Header.Get("X-API-Key"), string(b), r.Header.Get("Content-Type")}
			w.WriteHeader(201)
		}
	}
	nodeCh, otherCh := make(chan got, 4), make(chan got, 4)
	node := httptest.NewServer(rec(nodeCh))
	defer node.Close()
	other := httptest.NewServer(rec(otherCh))
	defer other.Close()
	c := New(node.URL, "secret")
	ctx := context.Background()
	for _, link := range []string{"", "/templates/t/files/h", node.URL + "/templates/t/files/h"} {
		if err := c.UploadTemplateFiles(ctx, "t", "h", link, strings.NewReader("tar"), 3); err != nil {
			t.Fatal(err)
		}
		if g := <-nodeCh; g != (got{"/templates/t/files/h", "secret", "tar", "application/octet-stream"}) {
			t.Fatalf("upload to %q: %+v", link, g)
		}
	}
	if err := c.UploadTemplateFiles(ctx, "t", "h", other.URL+"/bucket/obj?sig=1", strings.NewReader("tar"), 3); err != nil {
		t.Fatal(err)
	}
	if g := <-otherCh; g.key != "" || g.path != "/bucket/obj" {
		t.Fatalf("upload to another host: %+v", g)
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		fmt.Fprint(w, `{"code":400,"message":"sha256 mismatch"}`)
	}))
	defer bad.Close()
	err := New(bad.URL, "k").UploadTemplateFiles(ctx, "t", "h", "", strings.NewReader("x"), 1)
	if err == nil || !strings.Contains(err.Error(), "upload files h of template t: server answered 400: sha256 mismatch") {
		t.Fatalf("failed upload: %v", err)
	}
}
