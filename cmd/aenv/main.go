// Command aenv is the AgentENV command-line interface.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/cli/guestcmd"
	"github.com/agentenv/agentenv/cli/imagecmd"
	"github.com/agentenv/agentenv/cli/pullcmd"
	"github.com/agentenv/agentenv/cli/sandboxcmd"
	"github.com/agentenv/agentenv/internal/inherited"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/spf13/cobra"
)

func main() {
	if err := inherited.CloseOnExec(); err != nil { // helpers it starts get only what they are handed
		fmt.Fprintln(os.Stderr, "aenv:", err)
		os.Exit(1)
	}
	root := &cobra.Command{
		Use:           "aenv",
		Short:         "AgentENV: microVM sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get().String(),
	}
	root.SetVersionTemplate("aenv {{.Version}}\n")
	root.AddCommand(guestcmd.NewCommand(), imagecmd.NewCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(*cobra.Command, []string) { fmt.Println("aenv", version.Get()) },
	})
	root.AddCommand(pullcmd.NewCommand())
	root.AddCommand(sandboxcmd.Commands()...)
	root.AddCommand(sandboxcmd.BuildCommand())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		var exit *sandboxcmd.ExitError
		if errors.As(err, &exit) {
			stop()
			os.Exit(exit.Code)
		}
		fmt.Fprintln(os.Stderr, "aenv:", err)
		if ctx.Err() != nil {
			os.Exit(130) // interrupted, as shells report SIGINT
		}
		os.Exit(1)
	}
}
