package sandboxcmd

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// attach runs an interactive terminal in sb: the local terminal in raw
// mode, window-size changes forwarded. argv nil runs the login shell.
func attach(cmd *cobra.Command, sb *client.Sandbox, argv []string) (int, error) {
	in, out := cmd.InOrStdin(), cmd.OutOrStdout()
	o := client.TerminalOptions{Argv: argv, Env: map[string]string{"TERM": termName()}}
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		if w, h, err := term.GetSize(fd); err == nil {
			o.Size = client.Size{Cols: uint16(w), Rows: uint16(h)}
		}
		old, err := term.MakeRaw(fd)
		if err != nil {
			return -1, fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer term.Restore(fd, old)
		resizes := make(chan client.Size, 1)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					select {
					case resizes <- client.Size{Cols: uint16(w), Rows: uint16(h)}:
					default: // one pending is enough: the newest size is read when sent
					}
				}
			}
		}()
		o.Resizes = resizes
	}
	return sb.Terminal(cmd.Context(), o, in, out)
}

func termName() string {
	if t := os.Getenv("TERM"); t != "" && t != "dumb" {
		return t
	}
	return "xterm-256color"
}
