package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/cli/vmcmd"
	"github.com/agentenv/agentenv/internal/inherited"
	"github.com/spf13/cobra"
)

// vmMain runs `aenvd vm ...` (args start with "vm"): the development
// command that boots a sandbox VM without the server. It returns the exit
// status.
func vmMain(args []string) int {
	if err := inherited.CloseOnExec(); err != nil { // the VMM gets only what it is handed
		fmt.Fprintln(os.Stderr, "aenvd:", err)
		return 1
	}
	root := &cobra.Command{Use: "aenvd", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(vmcmd.NewCommand())
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "aenvd:", err)
		if ctx.Err() != nil {
			return 130 // interrupted, as shells report SIGINT
		}
		return 1
	}
	return 0
}
