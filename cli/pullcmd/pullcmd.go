// Package pullcmd is `aenv pull IMAGE`: pull an OCI image from a registry and
// convert it into a bootable root filesystem stored as a sealed LSMT layer
// (package oci), printing the layer's path.
package pullcmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

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

// NewCommand returns `aenv pull`.
func NewCommand() *cobra.Command {
	var (
		opt      oci.Options
		conv     oci.ConvertOptions
		name     string
		user     string
		compress bool
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Pull an OCI image and convert it into a root filesystem layer",
		Long: `Pull an OCI image (linux/amd64) from a registry, verify and cache its layers by
digest, apply them into an ext4 root filesystem with the agent, /etc/hosts,
/etc/resolv.conf and the default user injected, and store it as a sealed LSMT
layer (cached by image digest). Prints the layer's path.

Credentials: --username with the password in $AENV_REGISTRY_PASSWORD, else the
Docker config keychain (~/.docker/config.json), else anonymous.`,
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" && !validName.MatchString(name) {
				return fmt.Errorf("pull: invalid name %q", name)
			}
			if compress {
				conv.Compress = &zfile.Options{}
			}
			if conv.Agent == "" {
				if p := defaultAgentPath(); p != "" {
					conv.Agent = p
				}
			}
			p, err := oci.NewPuller(opt)
			if err != nil {
				return err
			}
			if user != "" {
				r, err := p.ParseReference(args[0])
				if err != nil {
					return err
				}
				opt.Credentials = map[string]authn.AuthConfig{
					r.Context().RegistryStr(): {Username: user, Password: os.Getenv("AENV_REGISTRY_PASSWORD")},
				}
				if p, err = oci.NewPuller(opt); err != nil {
					return err
				}
			}
			img, err := p.Pull(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			rf, err := p.Convert(cmd.Context(), img, conv)
			if err != nil {
				return err
			}
			res := Result{Name: name, Ref: img.Ref, Digest: img.Digest.String(), Layer: rf.Path, SizeMiB: rf.SizeMiB, Cached: rf.Cached}
			if name != "" {
				if err := saveName(opt.CacheDir, res); err != nil {
					return err
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			fmt.Fprintln(cmd.OutOrStdout(), rf.Path)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "record the result under this name (CACHE/names/NAME.json)")
	f.StringVar(&opt.CacheDir, "cache", DefaultCacheDir, "cache directory (layer blobs, conversions)")
	f.StringVar(&opt.DefaultRegistry, "default-registry", "", "registry for references without a host (default index.docker.io)")
	f.StringSliceVar(&opt.AllowedRegistries, "allowed-registry", nil, "only pull from these registry hosts (repeatable)")
	f.StringSliceVar(&opt.InsecureRegistries, "insecure-registry", nil, "registry hosts reached over plain HTTP (repeatable)")
	f.StringVar(&user, "username", "", "registry user (password from $AENV_REGISTRY_PASSWORD)")
	f.StringVar(&conv.Agent, "agent", "", "aenv-agent binary to inject (default: aenv-agent next to this binary, if any)")
	f.IntVar(&conv.SizeMiB, "size", 0, "filesystem size in MiB (default: content + 25% + 64 MiB)")
	f.StringVar(&conv.Hostname, "hostname", "", "hostname for /etc/hostname and /etc/hosts (default aenv)")
	f.StringSliceVar(&conv.Nameservers, "nameserver", nil, "nameservers for /etc/resolv.conf (default 8.8.8.8)")
	f.BoolVar(&compress, "compress", false, "store the layer as a ZFile (zstd)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func saveName(cache string, res Result) error {
	dir := filepath.Join(cache, "names")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pull: record name %s: %w", res.Name, err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	tmp := filepath.Join(dir, "."+res.Name+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("pull: record name %s: %w", res.Name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, res.Name+".json")); err != nil {
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
