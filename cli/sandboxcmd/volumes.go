package sandboxcmd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// volumeCmd is `aenv volume create|list|rm`: the node's volumes (E2B's
// /volumes), which `aenv start --volume` mounts.
func volumeCmd() *cobra.Command {
	root := &cobra.Command{Use: "volume", Short: "Create, list and remove volumes (disks that outlive sandboxes)"}
	var sizeMiB int32
	var co, lo output
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a blank volume",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(&co, func(cmd *cobra.Command, args []string, c *client.Client) error {
			req := wire.NewVolume{Name: args[0]}
			if sizeMiB != 0 {
				req.SizeMiB = &sizeMiB
			}
			v, err := c.CreateVolume(cmd.Context(), req)
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), v)
			}
			return table(cmd.OutOrStdout(), volumeHeader, [][]string{volumeRow(wire.Volume{VolumeID: v.VolumeID, Name: v.Name,
				SizeMiB: v.SizeMiB, CreatedAt: v.CreatedAt, MountedBy: v.MountedBy})})
		}),
	}
	create.Flags().Int32Var(&sizeMiB, "size-mib", 0, "size limit in MiB (default: the node's)")
	co.register(create)
	list := &cobra.Command{
		Use:   "list",
		Short: "List the volumes",
		Args:  cobra.NoArgs,
		RunE: withClient(&lo, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			vs, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), &lo, vs, volumeHeader, volumeRow)
		}),
	}
	lo.register(list)
	rm := &cobra.Command{
		Use:   "rm VOLUME...",
		Short: "Remove volumes (by id or name) with their data; refused while a sandbox mounts one",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			for _, ref := range args {
				if err := c.DeleteVolume(cmd.Context(), ref); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	root.AddCommand(create, list, rm)
	return root
}

// volumeMounts parses --volume flags: NAME:PATH or NAME:PATH:ro (the node
// checks the name and path).
func volumeMounts(flags []string) ([]wire.SandboxVolumeMount, error) {
	var out []wire.SandboxVolumeMount
	for _, f := range flags {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || len(parts) == 3 && parts[2] != "ro" {
			return nil, fmt.Errorf("--volume %q: want NAME:PATH or NAME:PATH:ro", f)
		}
		m := wire.SandboxVolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			ro := true
			m.ReadOnly = &ro
		}
		out = append(out, m)
	}
	return out, nil
}

var volumeHeader = []string{"VOLUME ID", "NAME", "SIZE MIB", "MOUNTED BY"}

func volumeRow(v wire.Volume) []string {
	size, by := "-", "-"
	if v.SizeMiB != nil {
		size = strconv.Itoa(int(*v.SizeMiB))
	}
	if v.MountedBy != nil && len(*v.MountedBy) > 0 {
		by = strings.Join(*v.MountedBy, ",")
	}
	return []string{v.VolumeID, v.Name, size, by}
}
