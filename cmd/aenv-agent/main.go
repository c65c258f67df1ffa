// Command aenv-agent runs inside every sandbox VM. As PID 1 it performs the
// init duties (guest/initd) and then runs itself again as the agent server;
// as an ordinary process it is the E2B-compatible agent on :49983.
package main

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/guest/initd"
)

func main() {
	if os.Getpid() == 1 {
		initd.Main() // never returns
	}
	addr := flag.String("addr", ":49983", "listen address")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	slog.Info("aenv-agent listening", "addr", *addr)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		slog.Error("aenv-agent", "err", err)
		os.Exit(1)
	}
}
