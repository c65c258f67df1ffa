package config

import (
	"bytes"
	"embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"

	"github.com/BurntSushi/toml"
)

// The field documentation printed by EncodeDocumented is the doc comments
// of this package's own source: one text for readers of the code and of
// `aenvd --print-default-config`.
//
//go:embed config.go admission.go
var configSource embed.FS

// configFiles are the embedded files that declare the settings.
var configFiles = []string{"config.go", "admission.go"}

// EncodeDocumented writes c as TOML with every setting preceded by its
// documentation and its environment variable (aenvd --print-default-config).
func (c Config) EncodeDocumented() (string, error) {
	docs, err := fieldDocs()
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.WriteString("# aenvd configuration (TOML). Every setting is shown with its default; each can be\n")
	b.WriteString("# overridden by the environment variable named with it.\n")
	v := reflect.ValueOf(c)
	t := v.Type()
	var sections []int
	for i := range t.NumField() { // top-level keys before any [section]
		if t.Field(i).Type.Kind() == reflect.Struct && t.Field(i).Type != durationType {
			sections = append(sections, i)
			continue
		}
		if err := writeKey(&b, docs[t.Name()], t.Field(i), v.Field(i), ""); err != nil {
			return "", err
		}
	}
	for _, i := range sections {
		f := t.Field(i)
		fmt.Fprintf(&b, "\n%s[%s]\n", comment(docs["type "+f.Type.Name()][""]), tomlName(f))
		prev := ""
		for j := range f.Type.NumField() {
			field := f.Type.Field(j)
			if err := writeKey(&b, docs[f.Type.Name()], field, v.Field(i).Field(j), prev); err != nil {
				return "", err
			}
			prev = docs[f.Type.Name()][field.Name]
		}
	}
	return b.String(), nil
}

func tomlName(f reflect.StructField) string { return strings.Split(f.Tag.Get("toml"), ",")[0] }

// writeKey writes one key with its doc (unless it is prev, the doc just
// written for the key before) and environment variable.
func writeKey(b *bytes.Buffer, docs map[string]string, f reflect.StructField, v reflect.Value, prev string) error {
	var kv bytes.Buffer
	if err := toml.NewEncoder(&kv).Encode(map[string]any{tomlName(f): v.Interface()}); err != nil {
		return fmt.Errorf("encode config key %s: %w", tomlName(f), err)
	}
	if doc := docs[f.Name]; doc != prev {
		b.WriteString("\n" + comment(doc))
	}
	if env := f.Tag.Get("env"); env != "" {
		fmt.Fprintf(b, "# Environment: %s\n", env)
	}
	b.Write(kv.Bytes())
	return nil
}

// comment turns a doc comment into TOML comment lines.
func comment(doc string) string {
	doc = strings.TrimSpace(doc)
	if doc == "" {
		return ""
	}
	return "# " + strings.ReplaceAll(doc, "\n", "\n# ") + "\n"
}

// fieldDocs maps struct type name -> field name -> doc comment, and
// "type <name>" -> the type's own doc, from the embedded source. A comment
// on a line declaring several fields documents each of them.
func fieldDocs() (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	for _, name := range configFiles {
		src, err := configSource.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("config documentation %s: %w", name, err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("config documentation %s: %w", name, err)
		}
		typeDocs(f, out)
	}
	return out, nil
}

// typeDocs adds the documentation of f's struct types to out.
func typeDocs(f *ast.File, out map[string]map[string]string) {
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, sp := range g.Specs {
			ts := sp.(*ast.TypeSpec)
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			out["type "+ts.Name.Name] = map[string]string{"": g.Doc.Text()}
			fields := map[string]string{}
			var last string
			for _, fl := range st.Fields.List {
				doc := fl.Doc.Text()
				for _, n := range fl.Names {
					d := doc
					if d == "" && strings.Contains(last, n.Name) {
						d = last // "PoolLow and PoolHigh are ..." above the previous line
					}
					fields[n.Name] = d
				}
				if doc != "" {
					last = doc
				}
			}
			out[ts.Name.Name] = fields
		}
	}
}
