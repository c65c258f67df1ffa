// Package daemon is the start of the cluster's daemons (aenv-gateway,
// aenv-scheduler): flags whose defaults come from the environment, a
// --version flag, a slog logger on stderr, and a context that SIGINT or
// SIGTERM cancels, so that each main says only what is its own.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentenv/agentenv/internal/version"
)

// Main parses the command line with the flags define registers and runs
// run until it returns. It exits 0 after -h or --version, 2 on bad flags
// (the flag package has said why) and 1 when run fails (logged).
func Main(name string, define func(*flag.FlagSet), run func(ctx context.Context, log *slog.Logger) error) {
	exit, err := Parse(name, os.Args[1:], os.Stdout, define)
	if errors.Is(err, flag.ErrHelp) || (err == nil && exit) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, log)
	stop()
	if err != nil {
		log.Error(name+" failed", "err", err)
		os.Exit(1)
	}
}

// Parse parses args with the flags define registers plus --version; exit
// is true when --version was given (the version is written to out).
func Parse(name string, args []string, out io.Writer, define func(*flag.FlagSet)) (exit bool, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	define(fs)
	printVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return false, fmt.Errorf("parse flags of %s: %w", name, err)
	}
	if *printVersion {
		fmt.Fprintln(out, name, version.Get())
		return true, nil
	}
	return false, nil
}

// EnvOr is the environment variable k, or def when it is unset or empty:
// the default of a flag.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// SplitList splits a comma-separated flag into its non-empty, trimmed
// items.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
