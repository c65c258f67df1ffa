// Package guestcmd is the `aenv guest` command tree: building and inspecting
// the guest assets (kernel, initramfs, root filesystem) VMs boot from.
package guestcmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/guest/variants"
	"github.com/spf13/cobra"
)

// NewCommand returns `aenv guest`.
func NewCommand() *cobra.Command {
	root := &cobra.Command{Use: "guest", Short: "Build the guest kernel, initramfs and root filesystem"}
	root.AddCommand(newBuild())
	return root
}

func newBuild() *cobra.Command {
	var opts image.Options
	var asJSON bool
	var variant string
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Assemble guest assets from Debian packages (cached by content hash)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Agent == "" {
				opts.Agent = defaultAgentPath()
			}
			if variant != "" {
				v, err := variants.Lookup(variant)
				if err != nil {
					return err
				}
				rootfs, err := image.BuildVariant(cmd.Context(), opts, v)
				if err != nil {
					return err
				}
				fmt.Printf("rootfs   %s\n", rootfs)
				return nil
			}
			a, err := image.Build(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(a)
			}
			fmt.Printf("kernel   %s (%s)\ninitrd   %s\nrootfs   %s\n", a.Kernel, a.KernelVersion, a.Initrd, a.Rootfs)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Agent, "agent", "", "static aenv-agent binary to inject (default: aenv-agent next to this binary)")
	f.StringVar(&opts.CacheDir, "cache", image.DefaultCacheDir(), "cache directory")
	f.StringVar(&opts.KernelPackage, "kernel-package", image.DefaultKernelPackage, "Debian kernel package")
	f.StringVar(&opts.Suite, "suite", image.DefaultSuite, "Debian suite for the root filesystem")
	f.StringVar(&opts.Mirror, "mirror", "", "Debian mirror (default "+image.DefaultMirror+" or $AENV_DEBIAN_MIRROR)")
	f.IntVar(&opts.RootfsMiB, "rootfs-size", image.DefaultRootfsMiB, "root filesystem size in MiB (sparse)")
	f.StringVar(&variant, "variant", "", "build only the root filesystem of a template's variant ("+strings.Join(variants.Names(), ", ")+")")
	f.BoolVar(&asJSON, "json", false, "print the asset paths as JSON")
	return cmd
}

func defaultAgentPath() string {
	exe, err := os.Executable()
	if err != nil {
		return "aenv-agent"
	}
	return filepath.Join(filepath.Dir(exe), "aenv-agent")
}
