package e2e

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
)

// fileDescRE finds the serialized descriptors the SDK embeds (protobuf-es codegen).
var fileDescRE = regexp.MustCompile(`fileDesc\)\("([A-Za-z0-9+/=]+)"`)

// TestProtosMatchSDK compares our .proto definitions with the ones compiled
// into each E2B SDK: every service, method, message, field (name, number,
// type, label, oneof) and enum value must agree in both directions.
func TestProtosMatchSDK(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	ours := map[string]protoreflect.FileDescriptor{
		"process/process.proto":       pb.File_process_process_proto,
		"filesystem/filesystem.proto": fspb.File_filesystem_filesystem_proto,
	}
	for _, ver := range sdkVersions {
		t.Run("sdk-"+ver, func(t *testing.T) {
			js := filepath.Join(filepath.Dir(here), "sdk-"+ver, "node_modules", "e2b", "dist", "index.js")
			src, err := os.ReadFile(js)
			if err != nil {
				t.Fatalf("E2B SDK %s is not installed (%v): run %s", ver, err, setupScript)
			}
			found := map[string]bool{}
			for _, m := range fileDescRE.FindAllSubmatch(src, -1) {
				raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(string(m[1]), "="))
				if err != nil {
					t.Fatalf("decode embedded descriptor: %v", err)
				}
				var theirs descriptorpb.FileDescriptorProto
				if err := proto.Unmarshal(raw, &theirs); err != nil {
					t.Fatalf("unmarshal embedded descriptor: %v", err)
				}
				fd, ok := ours[theirs.GetName()]
				if !ok {
					continue
				}
				found[theirs.GetName()] = true
				a, b := shape(&theirs), shape(protodesc.ToFileDescriptorProto(fd))
				if len(a) < 20 {
					t.Fatalf("%s: only %d facts decoded from the SDK", theirs.GetName(), len(a))
				}
				for _, l := range a {
					if !slices.Contains(b, l) {
						t.Errorf("%s: SDK has %s, we do not", theirs.GetName(), l)
					}
				}
				for _, l := range b {
					if !slices.Contains(a, l) {
						t.Errorf("%s: we have %s, the SDK does not", theirs.GetName(), l)
					}
				}
			}
			for name := range ours {
				if !found[name] {
					t.Errorf("SDK %s embeds no %s", ver, name)
				}
			}
		})
	}
}

// shape lists the wire-relevant facts of a file, one string each.
func shape(f *descriptorpb.FileDescriptorProto) []string {
	out := []string{"package " + f.GetPackage()}
	for _, m := range f.GetMessageType() {
		out = append(out, messageShape(f.GetPackage()+"."+m.GetName(), m)...)
	}
	for _, e := range f.GetEnumType() {
		out = append(out, enumShape(f.GetPackage()+"."+e.GetName(), e)...)
	}
	for _, s := range f.GetService() {
		for _, m := range s.GetMethod() {
			out = append(out, fmt.Sprintf("rpc %s.%s/%s(%s stream=%v) %s stream=%v", f.GetPackage(), s.GetName(), m.GetName(),
				m.GetInputType(), m.GetClientStreaming(), m.GetOutputType(), m.GetServerStreaming()))
		}
	}
	slices.Sort(out)
	return out
}

func messageShape(name string, m *descriptorpb.DescriptorProto) []string {
	out := []string{"message " + name}
	for _, f := range m.GetField() {
		oneof := ""
		if f.OneofIndex != nil && !f.GetProto3Optional() {
			oneof = m.GetOneofDecl()[f.GetOneofIndex()].GetName()
		}
		out = append(out, fmt.Sprintf("field %s.%s = %d %v %v %s optional=%v oneof=%s", name, f.GetName(), f.GetNumber(),
			f.GetType(), f.GetLabel(), f.GetTypeName(), f.GetProto3Optional(), oneof))
	}
	for _, n := range m.GetNestedType() {
		out = append(out, messageShape(name+"."+n.GetName(), n)...)
	}
	for _, e := range m.GetEnumType() {
		out = append(out, enumShape(name+"."+e.GetName(), e)...)
	}
	return out
}

func enumShape(name string, e *descriptorpb.EnumDescriptorProto) []string {
	var out []string
	for _, v := range e.GetValue() {
		out = append(out, fmt.Sprintf("enum %s.%s = %d", name, v.GetName(), v.GetNumber()))
	}
	return out
}
