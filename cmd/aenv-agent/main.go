// Command aenv-agent runs inside every sandbox VM. As PID 1 it performs the
// init duties (guest/initd) and then runs itself again as the agent server;
// as an ordinary process it is the E2B-compatible agent on :49983.
package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/initd"
)

func main() {
	if os.Getpid() == 1 {
		initd.Main() // never returns
	}
	addr := flag.String("addr", agent.DefaultAddr, "listen address")
	skipInit := flag.Bool("skip-init-duties", false, "do not act on the guest system during /init (no clock setting); for running on a host")
	user := flag.String("default-user", "", "user that requests act as when they name none (default: \"user\" when it exists, else the user the agent runs as)")
	debug := flag.Bool("debug", false, "log at debug level")
	flag.Parse()

	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	ring := agent.NewLogRing() // the recent lines, for the node's GET /sandboxes/{id}/logs
	log := slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, ring), &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a := agent.New(agent.Config{DefaultUser: *user, SkipInitDuties: *skipInit, Logger: log, Logs: ring})
	log.Info("aenv-agent listening", "addr", *addr, "version", agent.Version)
	if err := agent.Serve(ctx, *addr, a); err != nil {
		log.Error("aenv-agent", "err", err)
		os.Exit(1)
	}
}
