// Package cli is the command-line scaffold that snapctl and lazyfs share:
// flag sets that print a synopsis, a description, the options with their
// aliases and defaults and the exit statuses; usage errors; and ExitCode,
// the one mapping from errors to documented exit statuses.
package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a command and exits with the status of its error: run gets
// the arguments after the program name and a context that SIGINT, SIGTERM
// and sigs cancel.
func Main(prog string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error, sigs ...os.Signal) {
	ctx, stop := signal.NotifyContext(context.Background(), append([]os.Signal{os.Interrupt, syscall.SIGTERM}, sigs...)...)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil // before stop, which cancels it too
	stop()
	os.Exit(Report(os.Stderr, prog, err, interrupted))
}
