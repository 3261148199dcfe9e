// Command server runs the seckill HTTP API.
//
// Configuration comes from the environment only (see docs/configuration.md). With
// neither MYSQL_DSN nor REDIS_ADDR it runs a single-instance demo on an
// in-process Redis and an in-memory SQLite, so that `go run ./cmd/server`
// is all a newcomer needs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "seckill:", err)
		os.Exit(1)
	}
}
