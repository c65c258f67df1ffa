// Package pullcmd is `aenv pull IMAGE`: by default a template build on aenvd
// from the image with no steps (the node pulls and converts it), followed
// until ready; with --local, pull the OCI image here and convert it into a
// bootable root filesystem stored as a sealed LSMT layer (package oci),
// printing the layer's path.
package pullcmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/agentenv/agentenv/cli/sandboxcmd"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"
)

// DefaultCacheDir holds layer blobs and conversions.
const DefaultCacheDir = "/var/cache/aenv/oci"

// Result is what `aenv pull --json` prints.
type Result struct {
	Name    string `json:"name,omitempty"`
	Ref     string `json:"ref"`
	Digest  string `json:"digest"`
	Layer   string `json:"layer"`
	SizeMiB int    `json:"size_mib"`
	Cached  bool   `json:"cached"`
}

var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)

// pull holds `aenv pull`'s flags.
type pull struct {
	opt      oci.Options
	conv     oci.ConvertOptions
	name     string
	user     string
	compress bool
	asJSON   bool
	local    bool
	remote   client.BuildRequest
	poll     time.Duration
	format   string
}

// NewCommand returns `aenv pull`.
func NewCommand() *cobra.Command {
	var p pull
	cmd := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Make a template from an OCI image (on aenvd; --local converts it here)",
		Long: `Build a template on aenvd from an OCI image (linux/amd64) with no further steps: the
node pulls the image, converts it into a root filesystem with the agent, boots it, runs the
start command if any and snapshots it. The build's log is followed until the template is
ready; then ` + "`aenv start NAME`" + ` starts sandboxes from it. NAME defaults to the image's
repository name (ubuntu for ubuntu:22.04).

With --local, pull the image here instead: verify and cache its layers by digest, apply
them into an ext4 root filesystem with the agent, /etc/hosts, /etc/resolv.conf and the
default user injected, and store it as a sealed LSMT layer (cached by image digest).
Prints the layer's path. Credentials (--local): --username with the password in
$AENV_REGISTRY_PASSWORD, else the Docker config keychain (~/.docker/config.json), else
anonymous.`,
		Example:      "  aenv pull ubuntu:22.04 --name ubuntu\n  aenv pull python:3.13-slim --name py --start-cmd 'python -m http.server' --ready-cmd 'curl -s localhost:8000'\n  aenv pull --local ubuntu:22.04 --cache /var/cache/aenv/oci",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if p.name != "" && !validName.MatchString(p.name) {
				return fmt.Errorf("pull: invalid name %q", p.name)
			}
			if !p.local {
				return p.onServer(cmd, args[0])
			}
			return p.here(cmd, args[0])
		},
	}
	p.bind(cmd)
	return cmd
}

func (p *pull) bind(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&p.name, "name", "", "record the result under this name (CACHE/names/NAME.json)")
	f.StringVar(&p.opt.CacheDir, "cache", DefaultCacheDir, "cache directory (layer blobs, conversions)")
	f.StringVar(&p.opt.DefaultRegistry, "default-registry", "", "registry for references without a host (default index.docker.io)")
	f.StringSliceVar(&p.opt.AllowedRegistries, "allowed-registry", nil, "only pull from these registry hosts (repeatable)")
	f.StringSliceVar(&p.opt.InsecureRegistries, "insecure-registry", nil, "registry hosts reached over plain HTTP (repeatable)")
	f.StringVar(&p.user, "username", "", "registry user (password from $AENV_REGISTRY_PASSWORD)")
	f.StringVar(&p.conv.Agent, "agent", "", "aenv-agent binary to inject (default: aenv-agent next to this binary, if any)")
	f.IntVar(&p.conv.SizeMiB, "size", 0, "filesystem size in MiB (default: content + 25% + 64 MiB)")
	f.StringVar(&p.conv.Hostname, "hostname", "", "hostname for /etc/hostname and /etc/hosts (default aenv)")
	f.StringSliceVar(&p.conv.Nameservers, "nameserver", nil, "nameservers for /etc/resolv.conf (default 8.8.8.8)")
	f.BoolVar(&p.compress, "compress", false, "store the layer as a ZFile (zstd)")
	f.BoolVar(&p.asJSON, "json", false, "print the result as JSON")
	f.BoolVar(&p.local, "local", false, "pull and convert the image on this machine instead of building a template on aenvd")
	f.StringVar(&p.remote.StartCmd, "start-cmd", "", "command started in the template before its snapshot")
	f.StringVar(&p.remote.ReadyCmd, "ready-cmd", "", "command that succeeds once the start command is ready")
	f.Int32Var(&p.remote.CPUCount, "cpu", 0, "vCPUs of the template's sandboxes (default: the server's)")
	f.Int32Var(&p.remote.MemoryMB, "memory", 0, "memory in MiB of the template's sandboxes (default: the server's)")
	f.DurationVar(&p.poll, "poll", time.Second, "build status poll interval")
	f.StringVarP(&p.format, "output", "o", "table", "output format: table or json")
}

// onServer builds the template on aenvd and follows the build.
func (p *pull) onServer(cmd *cobra.Command, ref string) error {
	for _, f := range localFlags {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("pull: --%s applies to --local only (the node pulls with its own [image] configuration)", f)
		}
	}
	p.remote.FromImage = ref
	p.remote.Name = p.name
	if p.remote.Name == "" {
		p.remote.Name = defaultName(ref)
	}
	if p.asJSON {
		p.format = "json"
	}
	return sandboxcmd.ServerBuild(cmd, p.remote, p.poll, p.format)
}

// here pulls and converts the image on this machine and prints the layer.
func (p *pull) here(cmd *cobra.Command, ref string) error {
	for _, f := range []string{"start-cmd", "ready-cmd", "cpu", "memory", "output"} {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("pull: --%s does not apply to --local", f)
		}
	}
	if p.compress {
		p.conv.Compress = &zfile.Options{}
	}
	if p.conv.Agent == "" {
		p.conv.Agent = defaultAgentPath()
	}
	puller, err := p.puller(ref)
	if err != nil {
		return err
	}
	img, err := puller.Pull(cmd.Context(), ref)
	if err != nil {
		return err
	}
	rf, err := puller.Convert(cmd.Context(), img, p.conv)
	if err != nil {
		return err
	}
	res := Result{Name: p.name, Ref: img.Ref, Digest: img.Digest.String(), Layer: rf.Path, SizeMiB: rf.SizeMiB, Cached: rf.Cached}
	if p.name != "" {
		if err := saveName(p.opt.CacheDir, res); err != nil {
			return err
		}
	}
	if p.asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
	}
	fmt.Fprintln(cmd.OutOrStdout(), rf.Path)
	return nil
}

// puller is a puller with --username's credentials for ref's registry (the
// reference is parsed with the puller's own default registry).
func (p *pull) puller(ref string) (*oci.Puller, error) {
	pl, err := oci.NewPuller(p.opt)
	if err != nil || p.user == "" {
		return pl, err
	}
	r, err := pl.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	p.opt.Credentials = map[string]authn.AuthConfig{
		r.Context().RegistryStr(): {Username: p.user, Password: os.Getenv("AENV_REGISTRY_PASSWORD")},
	}
	return oci.NewPuller(p.opt)
}

// localFlags only make sense when converting here.
var localFlags = []string{"cache", "default-registry", "allowed-registry", "insecure-registry", "username", "agent", "size", "hostname", "nameserver", "compress"}

// defaultName is the template name for an image reference: its repository's
// last path component (ubuntu for docker.io/library/ubuntu:22.04).
func defaultName(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	last := ref[strings.LastIndex(ref, "/")+1:]
	last, _, _ = strings.Cut(last, ":")
	last = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, last)
	if last == "" {
		return "image"
	}
	return last
}

func saveName(cache string, res Result) error {
	dir := filepath.Join(cache, "names")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pull: record name %s: %w", res.Name, err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(dir, res.Name+".json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("pull: record name %s: %w", res.Name, err)
	}
	return nil
}

// defaultAgentPath is aenv-agent next to the running binary, if present.
func defaultAgentPath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), "aenv-agent")
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
		return p
	}
	return ""
}
