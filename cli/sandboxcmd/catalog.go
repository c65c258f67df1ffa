package sandboxcmd

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

func snapshotCmd() *cobra.Command {
	root := &cobra.Command{Use: "snapshot", Short: "Create and list named sandbox snapshots"}
	var name string
	var co, lo output
	create := &cobra.Command{
		Use:   "create SANDBOX_ID",
		Short: "Snapshot a sandbox (it keeps running)",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(&co, func(cmd *cobra.Command, args []string, c *client.Client) error {
			s, err := c.CreateSnapshot(cmd.Context(), args[0], name)
			if errors.Is(err, client.ErrUnsupported) {
				return fmt.Errorf("%w: this aenvd has no snapshots yet", err)
			}
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), s)
			}
			return table(cmd.OutOrStdout(), []string{"SNAPSHOT ID", "NAMES"}, [][]string{{s.SnapshotID, orDash(strings.Join(s.Names, ","))}})
		}),
	}
	create.Flags().StringVar(&name, "name", "", "name of the snapshot")
	co.register(create)
	var sbx string
	list := &cobra.Command{
		Use:   "list",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: withClient(&lo, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			snaps, err := c.ListSnapshots(cmd.Context(), sbx)
			if errors.Is(err, client.ErrUnsupported) {
				return fmt.Errorf("%w: this aenvd has no snapshots yet", err)
			}
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), &lo, snaps, []string{"SNAPSHOT ID", "SANDBOX ID", "NAMES", "LIVES"}, func(s client.Snapshot) []string {
				return []string{s.SnapshotID, orDash(s.SandboxID), orDash(strings.Join(s.Names, ",")), lives(s)}
			})
		}),
	}
	list.Flags().StringVar(&sbx, "sandbox", "", "only snapshots of this sandbox")
	lo.register(list)
	root.AddCommand(create, list)
	return root
}

func templateCmd() *cobra.Command {
	root := &cobra.Command{Use: "template", Aliases: []string{"templates"}, Short: "Build, list and remove templates"}
	var o output
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: withClient(&o, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			header := []string{"TEMPLATE ID", "ALIASES", "STATUS", "CPU", "MEM MB", "ENVD", "CREATED"}
			return printList(cmd.OutOrStdout(), &o, ts, header, func(t wire.Template) []string {
				return []string{t.TemplateID, orDash(strings.Join(t.Aliases, ",")), string(t.BuildStatus),
					strconv.Itoa(int(t.CpuCount)), strconv.Itoa(int(t.MemoryMB)), t.EnvdVersion, when(t.CreatedAt)}
			})
		}),
	}
	o.register(list)
	rm := &cobra.Command{
		Use:   "rm TEMPLATE_ID...",
		Short: "Remove templates",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			for _, id := range args {
				err := c.DeleteTemplate(cmd.Context(), id)
				if errors.Is(err, client.ErrUnsupported) {
					return fmt.Errorf("%w: this aenvd cannot remove templates yet", err)
				}
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "Removed template", id)
			}
			return nil
		}),
	}
	root.AddCommand(list, rm, templateBuildCmd(), templateWatchCmd())
	return root
}

func nodesCmd() *cobra.Command {
	var o output
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the nodes and their load (through a gateway: every node of the cluster)",
		Args:  cobra.NoArgs,
		RunE: withClient(&o, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			ns, err := c.ClusterNodes(cmd.Context())
			if err != nil {
				return err
			}
			header := []string{"NODE ID", "STATUS", "VERSION", "VMM", "RUNNING/PAUSED", "CPU", "MEM MB"}
			cluster := slices.ContainsFunc(ns, func(n client.ClusterNode) bool { return n.Cluster != nil })
			if cluster {
				header = append(header, "CLUSTER", "BOUND", "API URL")
			}
			return printList(cmd.OutOrStdout(), &o, ns, header, func(n client.ClusterNode) []string {
				row := []string{n.NodeID, string(n.Status), n.Version, n.Vmm.Driver + "/" + n.Vmm.Accel,
					fmt.Sprintf("%d/%d", n.Sandboxes.Running, n.Sandboxes.Paused),
					fmt.Sprintf("%d/%d", n.AllocatedCPU, n.CpuCount), fmt.Sprintf("%d/%d", n.MemoryUsedMB, n.MemoryTotalMB)}
				if cluster {
					row = append(row, clusterColumns(n.Cluster)...)
				}
				return row
			})
		}),
	}
	o.register(cmd)
	return cmd
}

// lives says where a snapshot lives: on its node, or also in the snapshot
// repository (once its upload finished).
func lives(s client.Snapshot) string {
	switch s.Repository {
	case "":
		return "node"
	case "uploaded":
		return "node+repository"
	default:
		return "node (repository: " + s.Repository + ")"
	}
}

func clusterColumns(c *client.NodeCluster) []string {
	if c == nil {
		return []string{"-", "-", "-"}
	}
	state := c.State
	if c.Draining {
		state += ",draining"
	}
	return []string{state, strconv.Itoa(int(c.Bound)), c.APIURL}
}

// nodeCmd is `aenv node drain|undrain NODE_ID`: POST /nodes/{id}, which a
// single aenvd answers for itself and a gateway for any node it places on.
func nodeCmd() *cobra.Command {
	root := &cobra.Command{Use: "node", Short: "Drain and undrain a node (through aenv-gateway: any node of the cluster)"}
	root.AddCommand(
		nodeStatusCmd("drain", "draining", "Stop placing new sandboxes on a node (its sandboxes keep running)"),
		nodeStatusCmd("undrain", "ready", "Let a drained node take new sandboxes again"))
	return root
}

func nodeStatusCmd(use, status, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use + " NODE_ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			if err := c.SetNodeStatus(cmd.Context(), args[0], status); err != nil {
				return err
			}
			n, err := c.Node(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			draining := n.Status == wire.NodeStatusDraining || (n.Cluster != nil && n.Cluster.Draining)
			fmt.Fprintf(cmd.OutOrStdout(), "node %s: %s, draining %t\n", n.NodeID, n.Status, draining)
			return nil
		}),
	}
}
