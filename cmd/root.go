// Package cmd wires kiln's command line with cobra. Each command fills an
// options struct from flags and environment, validates it and makes one call
// into a library package; results go to stdout, progress and logs to stderr.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by every command.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
	ExitCheck   = 3 // a check failed: mismatch, lint problems, budget missed
	ExitPartial = 4 // the run finished but some requested work needs hardware that is missing
)

// ExitError carries an exit code through cobra's error return.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}
func (e *ExitError) Unwrap() error { return e.Err }

// globalOptions are flags every command shares.
type globalOptions struct {
	verbose   int
	logFormat string
	ortLib    string
}

// New builds a fresh root command; nothing is kept in package variables so
// tests can build as many as they like.
func New() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:   "kiln",
		Short: "Bake a trained model into a verified NVIDIA Triton deployment",
		Long: `kiln converts ONNX models into optimized variants (ONNX fp32/fp16/int8,
TensorRT engines built by trtexec), calibrates INT8 on real data and measures
what it costs in accuracy, and writes Triton model repositories whose configs
are checked with Triton's own rules.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(c *cobra.Command, _ []string) error {
			if g.logFormat != "text" && g.logFormat != "json" {
				return usageErr(fmt.Errorf("--log-format must be text or json, not %q", g.logFormat))
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.CountVarP(&g.verbose, "verbose", "v", "more log output on stderr (-v info, -vv debug)")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format on stderr: text or json")
	pf.StringVar(&g.ortLib, "ort-lib", "", "path to the ONNX Runtime shared library (default: $KILN_ORT_LIB, then .cache/ort/, then the system)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr(err) })

	root.AddCommand(
		newInspectCmd(g),
		newCalibrateCmd(g),
		newConvertCmd(g),
		newPbtxtCmd(g),
		newVersionCmd(),
	)
	return root
}

func usageErr(err error) error { return &ExitError{Code: ExitUsage, Err: err} }

// logger builds the slog logger for a command from the global flags.
func (g *globalOptions) logger(w io.Writer) *slog.Logger {
	level := slog.LevelWarn
	switch {
	case g.verbose >= 2:
		level = slog.LevelDebug
	case g.verbose == 1:
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if g.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// envOr returns the flag value when set, else the environment variable.
func envOr(flagValue, env string) string {
	if flagValue != "" {
		return flagValue
	}
	return os.Getenv(env)
}

// Execute runs the command line and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := New()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	code := ExitFailure
	if errors.As(err, &ee) {
		code = ee.Code
		if ee.Err == nil {
			return code
		}
	} else if isCobraUsage(err) {
		code = ExitUsage
	}
	fmt.Fprintf(stderr, "kiln: %v\n", err)
	if hint := advice(err); hint != "" {
		fmt.Fprintf(stderr, "hint: %s\n", hint)
	}
	return code
}
