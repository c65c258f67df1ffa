package dockerfile

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// stepsJSON renders the steps after the two implied first ones (USER root,
// WORKDIR /) and before the implied last ones, compactly.
func stepsJSON(t *testing.T, s *Spec) string {
	t.Helper()
	steps := s.Steps
	if len(steps) < 2 || steps[0].Type != "USER" || steps[0].Args[0] != "root" || steps[1].Type != "WORKDIR" || steps[1].Args[0] != "/" {
		t.Fatalf("steps do not start with USER root, WORKDIR /: %+v", steps)
	}
	steps = steps[2:]
	var parts []string
	for _, st := range steps {
		if st.Line == 0 {
			continue // implied
		}
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(append([]string{st.Type}, st.Args...))
		parts = append(parts, strings.TrimSpace(b.String()))
	}
	return strings.Join(parts, " ")
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		args      map[string]string
		from      string
		steps     string
		start     string
		warn      string // a substring of the warnings
	}{
		{name: "minimal", src: "FROM debian:12", from: "debian:12"},
		{name: "lower-case keywords and comments", src: "# hello\nfrom alpine\n  # indented comment\nrun echo hi # not a comment\n",
			from: "alpine", steps: `["RUN","echo hi # not a comment"]`},
		{name: "run shell and exec form", src: "FROM a\nRUN apt-get update && \\\n    apt-get install -y curl\nRUN [\"echo\", \"$HOME\", \"it's\"]",
			from: "a", steps: `["RUN","apt-get update &&     apt-get install -y curl"] ["RUN","echo '$HOME' 'it'\\''s'"]`},
		{name: "continuation with comment lines inside", src: "FROM a\nRUN echo a \\\n# comment\n  b",
			from: "a", steps: `["RUN","echo a   b"]`},
		{name: "env forms", src: "FROM a\nENV A=1 B=\"two words\" C=x\\ y\nENV LEGACY some value here\nENV D=$A-${B}",
			from: "a", steps: `["ENV","A","1","B","two words","C","x y"] ["ENV","LEGACY","some value here"] ["ENV","D","1-two words"]`},
		{name: "env single quotes keep dollar", src: "FROM a\nENV A='$HOME' B=\"\\$X\"",
			from: "a", steps: `["ENV","A","$HOME","B","$X"]`},
		{name: "path falls back to docker's default", src: "FROM a\nENV PATH=/opt/bin:$PATH",
			from: "a", steps: `["ENV","PATH","/opt/bin:` + DefaultPath + `"]`},
		{name: "unknown variable warns", src: "FROM a\nENV X=${NOPE}y", from: "a", steps: `["ENV","X","y"]`, warn: "$NOPE is not set"},
		{name: "arg defaults and substitution forms", src: "FROM a\nARG V=1.0\nARG EMPTY=\nENV A=${V:-x} B=${EMPTY:-def} C=${EMPTY-def} D=${V:+set} E=${MISSING:+set}",
			from: "a", steps: `["ENV","A","1.0","B","def","C","","D","set","E",""]`},
		{name: "build arg overrides", src: "FROM a\nARG V=1.0\nWORKDIR /opt/$V", args: map[string]string{"V": "2.0"},
			from: "a", steps: `["WORKDIR","/opt/2.0"]`},
		{name: "arg before from", src: "ARG BASE=debian\nARG TAG\nFROM $BASE:${TAG:-12}\nARG BASE\nENV B=$BASE", args: map[string]string{"TAG": "13"},
			from: "debian:13", steps: `["ENV","B","debian"]`},
		{name: "global arg not in scope without redeclaring", src: "ARG X=1\nFROM a\nENV Y=${X:-unset}",
			from: "a", steps: `["ENV","Y","unset"]`},
		{name: "args exported to run, env wins", src: "FROM a\nARG A=1 B='x y'\nENV A=2\nRUN echo $A $B",
			from: "a", steps: `["ENV","A","2"] ["RUN","export B='x y'; echo $A $B"]`},
		{name: "arg without value is unset", src: "FROM a\nARG NOVAL\nRUN true", from: "a", steps: `["RUN","true"]`},
		{name: "workdir relative and user", src: "FROM a\nWORKDIR /app\nWORKDIR src\nUSER app:staff\nWORKDIR ../lib",
			from: "a", steps: `["WORKDIR","/app"] ["WORKDIR","/app/src"] ["USER","app:staff"] ["WORKDIR","/app/lib"]`},
		{name: "copy forms", src: "FROM a\nWORKDIR /app\nCOPY --chown=user:user --chmod=755 run.sh ./bin/\nCOPY [\"a b.txt\", \"c\", \"/dst/\"]\nADD /etc/x rel\nCOPY . .\nCOPY --link src/*.go /go/",
			from: "a", steps: `["WORKDIR","/app"] ["COPY","run.sh","/app/bin/","user","0755"] ["COPY","a b.txt","/dst/","",""] ["COPY","c","/dst/","",""] ["COPY","etc/x","/app/rel","",""] ["COPY",".","/app/","",""] ["COPY","src/*.go","/go/","",""]`},
		{name: "chown group ignored", src: "FROM a\nCOPY --chown=app:staff x /y", from: "a", steps: `["COPY","x","/y","app",""]`, warn: "group staff ignored"},
		{name: "copy with variables", src: "FROM a\nARG D=/srv\nENV F=conf\nCOPY ${F}.yml $D/",
			from: "a", steps: `["ENV","F","conf"] ["COPY","conf.yml","/srv/","",""]`},
		{name: "cmd shell form", src: "FROM a\nCMD python -m http.server", from: "a", start: "python -m http.server"},
		{name: "cmd exec form", src: "FROM a\nCMD [\"python\", \"-c\", \"print('hi')\"]", from: "a", start: `python -c 'print('\''hi'\'')'`},
		{name: "entrypoint exec plus cmd", src: "FROM a\nENTRYPOINT [\"/bin/server\", \"--port\"]\nCMD [\"8080\"]", from: "a", start: "/bin/server --port 8080"},
		{name: "entrypoint shell ignores cmd", src: "FROM a\nCMD [\"x\"]\nENTRYPOINT exec /srv", from: "a", start: "exec /srv"},
		{name: "last cmd wins", src: "FROM a\nCMD one\nCMD two", from: "a", start: "two"},
		{name: "ignored instructions warn", src: "FROM a\nLABEL a=b\nEXPOSE 80\nVOLUME /data\nHEALTHCHECK CMD true\nSTOPSIGNAL SIGTERM\nONBUILD RUN x\nMAINTAINER me",
			from: "a", warn: "line 3: EXPOSE ignored"},
		{name: "escape directive", src: "# escape=`\nFROM a\nRUN echo a `\n  b\nCOPY x`y /d", from: "a", steps: `["RUN","echo a   b"] ["COPY","xy","/d","",""]`},
		{name: "single named stage", src: "FROM debian:12 AS base\nRUN true", from: "debian:12", steps: `["RUN","true"]`, warn: "stage name"},
		{name: "platform amd64", src: "FROM --platform=linux/amd64 a", from: "a"},
		{name: "run cache mount ignored", src: "FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x", from: "a", steps: `["RUN","pip install x"]`, warn: "type=cache"},
		{name: "unused build arg warns", src: "FROM a", args: map[string]string{"Z": "1"}, from: "a", warn: "--build-arg Z"},
		{name: "crlf", src: "FROM a\r\nRUN echo \\\r\n hi\r\n", from: "a", steps: `["RUN","echo  hi"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse(tt.src, Options{BuildArgs: tt.args})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if s.FromImage != tt.from {
				t.Errorf("from %q, want %q", s.FromImage, tt.from)
			}
			if got := stepsJSON(t, s); got != tt.steps {
				t.Errorf("steps\n got %s\nwant %s", got, tt.steps)
			}
			if s.StartCmd != tt.start {
				t.Errorf("start %q, want %q", s.StartCmd, tt.start)
			}
			if w := strings.Join(s.Warnings, "\n"); !strings.Contains(w, tt.warn) || (tt.warn == "" && w != "") {
				t.Errorf("warnings %q, want %q", w, tt.warn)
			}
		})
	}
}

func TestParseImpliedSteps(t *testing.T) {
	t.Parallel()
	s, err := Parse("FROM a\nRUN x", Options{})
	if err != nil {
		t.Fatal(err)
	}
	last := s.Steps[len(s.Steps)-2:]
	if last[0].Type != "USER" || last[0].Args[0] != "user" || last[1].Type != "WORKDIR" || last[1].Args[0] != "/home/user" {
		t.Fatalf("no sandbox defaults at the end: %+v", s.Steps)
	}
	s, err = Parse("FROM a\nUSER app\nWORKDIR /srv", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Steps); s.Steps[n-1].Args[0] != "/srv" || s.Steps[n-2].Args[0] != "app" {
		t.Fatalf("the Dockerfile's USER/WORKDIR must be the last: %+v", s.Steps)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, src, want string }{
		{"empty", "", "no FROM"},
		{"scratch", "FROM scratch", "line 1: FROM: FROM scratch is not supported"},
		{"multi-stage", "FROM a AS b\nRUN x\nFROM c", "line 3: FROM: multi-stage builds are not supported"},
		{"copy from stage", "FROM a\nCOPY --from=b /x /y", "line 2: COPY: --from"},
		{"add url", "FROM a\nADD https://example.com/x.tgz /x", "line 2: ADD: source \"https://example.com/x.tgz\": ADD of URLs is not supported"},
		{"add git", "FROM a\nADD git@github.com:a/b.git /x", "ADD of URLs"},
		{"copy url", "FROM a\nCOPY http://x/y /z", "COPY takes local files only"},
		{"escape context", "FROM a\nCOPY ../secret /x", "line 2: COPY: source \"../secret\" is outside the build context"},
		{"escape context nested", "FROM a\nCOPY a/../../b /x", "outside the build context"},
		{"shell", "FROM a\nSHELL [\"/bin/bash\", \"-c\"]", "line 2: SHELL: not supported"},
		{"unknown", "FROM a\nFROBNICATE x", "line 2: FROBNICATE: unknown or unsupported instruction"},
		{"before from", "RUN x\nFROM a", "line 1: RUN: comes before FROM"},
		{"no image", "FROM", "names no image"},
		{"other platform", "FROM --platform=linux/arm64 a", "linux/amd64 only"},
		{"env legacy without value", "FROM a\nENV A", "A has no value"},
		{"env mixed", "FROM a\nENV A=1 B", "is not NAME=VALUE"},
		{"bad var name", "FROM a\nARG 1X=2", "invalid variable name"},
		{"unterminated quote", "FROM a\nENV A=\"x", "unterminated double quote"},
		{"unterminated single", "FROM a\nENV A='x", "unterminated single quote"},
		{"bad substitution", "FROM a\nENV A=${B", "bad substitution"},
		{"unsupported substitution", "FROM a\nENV A=${B#x}", "unsupported substitution"},
		{"required variable", "FROM a\nENV A=\"${B:?must be set}\"", "B: must be set"},
		{"copy one arg", "FROM a\nCOPY x", "want COPY SRC... DEST"},
		{"copy several to file", "FROM a\nCOPY a b /dst", "must be a directory ending in /"},
		{"chmod not octal", "FROM a\nCOPY --chmod=u+x a /b", "--chmod=u+x"},
		{"copy unknown flag", "FROM a\nCOPY --parents a /b/", "flag --parents is not supported"},
		{"run mount bind", "FROM a\nRUN --mount=type=bind,source=x true", "flag --mount is not supported"},
		{"run network", "FROM a\nRUN --network=none true", "flag --network"},
		{"heredoc", "FROM a\nRUN <<EOF\necho\nEOF", "heredocs are not supported"},
		{"bad escape directive", "# escape=x\nFROM a", "escape directive"},
		{"run no command", "FROM a\nRUN", "no command"},
		{"cmd empty", "FROM a\nCMD", "no command"},
		{"user with spaces", "FROM a\nUSER a b", "want USER NAME"},
		{"workdir empty expansion", "FROM a\nWORKDIR $NOPE", "names no directory"},
		{"nested too deeply", "FROM a\nENV A=" + strings.Repeat("${X:-", 40) + strings.Repeat("}", 40), "nested too deeply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tt.src, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", tt.src, err, tt.want)
			}
			var de *Error
			if !errors.As(err, &de) || de.Line < 1 {
				t.Fatalf("error %v does not name a line", err)
			}
		})
	}
}

// TestExpansionBounded: variables doubling on every line stop at the size
// limit with an error instead of eating memory.
func TestExpansionBounded(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("FROM a\nARG A=0123456789abcdef\n")
	for range 40 {
		b.WriteString("ARG A=$A$A\n")
	}
	_, err := Parse(b.String(), Options{})
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("doubling expansion: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"FROM a\nRUN x",
		"ARG B=x\nFROM $B AS s\nENV A=${B:-y} C=\"q\\\"\" D='z'\nWORKDIR rel\nUSER u\nCOPY --chown=a:b --chmod=644 [\"s\", \"d/\"]\nCMD [\"a\"]\nENTRYPOINT [\"b\"]",
		"# escape=`\nFROM a\nRUN a `\n b\nADD x y",
		"FROM a\nENV A ${B:+${C:?x}}\nLABEL x=y\nEXPOSE 1",
		"FROM a\nRUN --mount=type=cache,target=/x [\"a\",\"b\"]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		// The same text as a .dockerignore: no panic, whatever the patterns.
		ParseIgnore(src).Excluded("a/b.txt")
		s, err := Parse(src, Options{BuildArgs: map[string]string{"B": "v"}})
		if err != nil {
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("error without a line: %v", err)
			}
			return
		}
		if s.FromImage == "" {
			t.Fatalf("no base image and no error for %q", src)
		}
		for _, st := range s.Steps {
			if st.Type == "COPY" && (len(st.Args) != 4 || strings.HasPrefix(st.Args[0], "..") || strings.HasPrefix(st.Args[0], "/")) {
				t.Fatalf("bad COPY step %+v from %q", st, src)
			}
		}
	})
}
