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
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-ml/kiln/ort"
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
	// routeORTLogs sends ONNX Runtime's log lines through the logger; set
	// when the command's stderr is the process's (not in tests).
	routeORTLogs bool
}

// New builds a fresh root command; nothing is kept in package variables so
// tests can build as many as they like.
func New() *cobra.Command { return newRoot(&globalOptions{}) }

func newRoot(g *globalOptions) *cobra.Command {
	root := &cobra.Command{
		Use:   "kiln",
		Short: "Bake a trained model into a verified NVIDIA Triton deployment",
		Long: `kiln converts ONNX models into optimized variants (ONNX fp32/fp16/int8,
TensorRT engines built by trtexec), calibrates INT8 on real data and measures
what it costs in accuracy, and writes Triton model repositories whose configs
are checked with Triton's own rules.`,
		Example: `  kiln inspect model.onnx
  kiln calibrate model.onnx --data images/ --preprocess imagenet -o calib
  kiln convert model.onnx --repo models --precision fp32,fp16,int8 --calib-dir calib
  kiln pbtxt lint models`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	groupCommand(root)
	pf := root.PersistentFlags()
	pf.CountVarP(&g.verbose, "verbose", "v", "more log output on stderr (-v info, -vv debug)")
	choice(pf, &g.logFormat, "log-format", formatText, "log format on stderr", formatText, formatJSON)
	pf.StringVar(&g.ortLib, "ort-lib", "", "`PATH` of the ONNX Runtime shared library (default: $KILN_ORT_LIB, then .cache/ort/, then the system)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr(err) })

	root.AddCommand(
		newInspectCmd(g),
		newImportCmd(g),
		newCalibrateCmd(g),
		newConvertCmd(g),
		newPbtxtCmd(g),
		newServeCmd(g),
		newPackCmd(g),
		newRunCmd(g),
		newInitCmd(g),
		newDeployCmd(), newPlanCmd(),
		newVersionCmd(),
	)
	// Cobra adds its completion command when it executes; adding it here
	// makes the tree New returns the whole tree (help goldens, vocabulary).
	root.InitDefaultCompletionCmd()
	return root
}

// groupCommand makes c, a command that only holds subcommands, print its
// help when run alone and refuse anything else as an unknown command (a
// usage error), with cobra's suggestions.
func groupCommand(c *cobra.Command) {
	c.SuggestionsMinimumDistance = 2
	c.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return usageErr(errors.New(msg))
	}
	c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
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
	if g.logFormat == formatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Execute runs the command line and returns the process exit code. Usage
// errors are recognized by type: every argument check, flag error and
// unknown command is an *ExitError with ExitUsage.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	defer ort.FlushLogs()
	root := newRoot(&globalOptions{routeORTLogs: stderr == io.Writer(os.Stderr)})
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
	}
	fmt.Fprintf(stderr, "kiln: %v\n", err)
	if hint := advice(err); hint != "" {
		fmt.Fprintf(stderr, "hint: %s\n", hint)
	}
	return code
}
