package sandboxcmd

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/agentenv/agentenv/compose"
	"github.com/spf13/cobra"
)

// composeCmd groups the commands of compose sandboxes.
func composeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "compose",
		Short: "Run a Docker Compose project in one sandbox",
	}
	cmd.AddCommand(composeUpCmd())
	return cmd
}

func composeUpCmd() *cobra.Command {
	var file, timeout string
	var md []string
	var o output
	cmd := &cobra.Command{
		Use:   "up -f FILE",
		Short: "Start an image-only Compose project in a new sandbox",
		Long: `Send the Compose file FILE ("-" reads standard input) to the node, which
validates it before anything starts: image-only services (1 to 24), no build,
privileged mode, added capabilities, devices, host bind mounts or host
namespaces, at most 1 MiB. A refusal names each offending key
(services.web.privileged). The node pulls the images through its own
registry configuration and starts the project in a sandbox of its
compose-v1 template (Docker Engine and Compose; the first use builds it,
which takes minutes). The sandbox is printed once every service started;
its published ports are reached like any sandbox port.`,
		Example: "  aenv compose up -f compose.yaml\n  aenv compose up -f - --timeout 30m < compose.yaml",
		Args:    cobra.NoArgs,
		RunE: withClient(&o, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			data, err := readComposeFile(cmd, file)
			if err != nil {
				return err
			}
			req := wire.NewComposeSandbox{Compose: string(data)}
			secs, err := seconds(timeout)
			if err != nil {
				return err
			}
			if secs > 0 {
				req.Timeout = &secs
			}
			meta, err := pairs("metadata", md)
			if err != nil {
				return err
			}
			if meta != nil {
				req.Metadata = &meta
			}
			s, err := c.CreateCompose(cmd.Context(), req)
			if err != nil {
				return err
			}
			return printSandbox(cmd, &o, s)
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", `the Compose file ("-" for standard input)`)
	cmd.Flags().StringVar(&timeout, "timeout", "", "lifetime in seconds or as a duration (default: the node's)")
	cmd.Flags().StringArrayVar(&md, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	o.register(cmd)
	return cmd
}

// readComposeFile reads at most one byte more than the node takes, so an
// oversized file is refused here without reading all of it.
func readComposeFile(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "" {
		return nil, errors.New("-f FILE is required (the Compose file, or - for standard input)")
	}
	var r io.Reader = cmd.InOrStdin()
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("read compose file: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, compose.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read compose file %s: %w", file, err)
	}
	if len(data) > compose.MaxFileBytes {
		return nil, fmt.Errorf("compose file %s is larger than %d bytes", file, compose.MaxFileBytes)
	}
	return data, nil
}
