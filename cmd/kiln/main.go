// Command kiln bakes a trained model into a verified NVIDIA Triton deployment.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kiln-ml/kiln/cmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cmd.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
