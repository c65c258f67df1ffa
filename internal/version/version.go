// Package version owns the build identity of every AgentENV binary: the
// release version, the source commit and the build date. `make release`
// stamps them at link time:
//
//	-ldflags "-X github.com/agentenv/agentenv/internal/version.version=v1.2.3
//	          -X github.com/agentenv/agentenv/internal/version.commit=<sha>
//	          -X github.com/agentenv/agentenv/internal/version.date=<RFC 3339>"
//
// An unstamped build (go build, go test, make build) reports the version
// "0.1.0-dev" and takes the commit and date from the VCS information the Go
// toolchain embeds, when there is any.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); plain strings because -X can only set those.
var (
	version = ""
	commit  = ""
	date    = ""
)

// Dev is the version of a build that was not stamped.
const Dev = "0.1.0-dev"

// Info is the build identity of the running binary.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Date    string `json:"date"`
	Go      string `json:"go"`
}

// Get returns the stamped identity, falling back to the embedded VCS data.
func Get() Info {
	i := Info{Version: version, Commit: commit, Date: date, Go: runtime.Version()}
	if i.Version == "" {
		i.Version = Dev
	}
	if i.Commit == "" || i.Date == "" {
		vcsCommit, vcsDate, modified := vcs()
		if i.Commit == "" {
			i.Commit = vcsCommit
			if modified && vcsCommit != "" {
				i.Commit += "-dirty"
			}
		}
		if i.Date == "" {
			i.Date = vcsDate
		}
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	if i.Date == "" {
		i.Date = "unknown"
	}
	return i
}

// Version is Get().Version.
func Version() string { return Get().Version }

// String is the one-line form the binaries print for --version.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, built %s, %s)", i.Version, i.Commit, i.Date, i.Go)
}

// vcs reads the revision, commit time and dirty flag the toolchain embeds
// when it builds inside a repository (-buildvcs=auto).
func vcs() (rev, when string, modified bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", "", false
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return rev, when, modified
}
