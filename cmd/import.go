package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/savedmodel"
)

type importOptions struct {
	output    string
	tags      string
	signature string
	opset     int64
	tf2onnx   bool
	shapes    []string
	format    string
}

func (o *importOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVarP(&o.output, "output", "o", "", "ONNX file to write (required)")
	f.StringVar(&o.tags, "tag", savedmodel.DefaultTags, "tag set of the meta graph to convert (comma-separated)")
	f.StringVar(&o.signature, "signature", savedmodel.DefaultSignature, "signature to convert")
	f.Int64Var(&o.opset, "opset", savedmodel.DefaultOpset, "ONNX opset to write")
	f.StringArrayVar(&o.shapes, "shape", nil, "shape of a signature input where TensorFlow left it unknown: NAME=DIMS, -1 a dynamic dimension, e.g. --shape X=-1 (repeatable); NAME is the signature key or the ONNX name")
	f.BoolVar(&o.tf2onnx, "tf2onnx", false, "convert with the external tf2onnx converter (python3 -m tf2onnx.convert) instead")
	formatFlag(f, &o.format)
}

func (o *importOptions) Validate() error {
	if o.output == "" {
		return usageErr(errors.New("-o, --output is required"))
	}
	if _, err := check.ParseShapes(o.shapes); err != nil {
		return usageErr(err)
	}
	if o.tf2onnx && len(o.shapes) > 0 {
		return usageErr(errors.New("--shape applies to kiln's own importer, not --tf2onnx"))
	}
	return (savedmodel.ConvertOptions{Opset: o.opset}).Validate()
}

// importResult is what import prints: the signature's name mapping, which
// config.pbtxt generation and clients need.
type importResult struct {
	Source    string                   `json:"source"`
	Output    string                   `json:"output"`
	Tags      string                   `json:"tags"`
	Signature string                   `json:"signature"`
	Inputs    []savedmodel.NameMapping `json:"inputs,omitempty"`
	Outputs   []savedmodel.NameMapping `json:"outputs,omitempty"`
	Converter string                   `json:"converter"`
}

func newImportCmd(_ *globalOptions) *cobra.Command {
	o := &importOptions{}
	c := &cobra.Command{
		Use:   "import DIR -o model.onnx",
		Short: "Convert a TensorFlow SavedModel to ONNX",
		Long: "Convert one signature of a TensorFlow SavedModel (a directory holding saved_model.pb, or a\n" +
			"model base directory whose highest numeric version is used) to ONNX in pure Go: functions\n" +
			"inlined, variables frozen, NHWC layers wrapped in Transposes that are then cancelled.\n" +
			"Graph inputs and outputs take the signature's argument names (sanitized).",
		Example: "  kiln import saved_model/ -o model.onnx\n" +
			"  kiln import models/resnet --signature serving_default --tag serve -o resnet.onnx\n" +
			"  kiln import saved_model/ -o model.onnx --tf2onnx",
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			r, err := o.run(c.Context(), args[0])
			if err != nil {
				return err
			}
			return printImport(c.OutOrStdout(), o.format, r)
		},
	}
	o.AddFlags(c.Flags())
	return c
}

func (o *importOptions) run(ctx context.Context, dir string) (*importResult, error) {
	r := &importResult{Source: dir, Output: o.output, Tags: o.tags, Signature: o.signature, Converter: "kiln"}
	if o.tf2onnx {
		r.Converter = "tf2onnx"
		return r, runTF2ONNX(ctx, dir, o)
	}
	shapes, err := check.ParseShapes(o.shapes)
	if err != nil {
		return nil, usageErr(err)
	}
	conv, err := importSavedModel(ctx, dir, o.output, savedmodel.ConvertOptions{Tags: o.tags, Signature: o.signature, Opset: o.opset, Shapes: shapes})
	if err != nil {
		return nil, err
	}
	r.Inputs, r.Outputs = conv.Inputs, conv.Outputs
	return r, nil
}

// importSavedModel converts the SavedModel at dir and writes the ONNX to
// out; convert and calibrate use it for a SavedModel argument.
func importSavedModel(ctx context.Context, dir, out string, o savedmodel.ConvertOptions) (*savedmodel.Conversion, error) {
	m, err := savedmodel.Open(ctx, dir, nil)
	if err != nil {
		return nil, err
	}
	conv, err := savedmodel.Convert(ctx, m, o)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", dir, err)
	}
	if err := conv.Model.Save(out); err != nil {
		return nil, fmt.Errorf("writing %s: %w", out, err)
	}
	return conv, nil
}

// errNoTF2ONNX says the external converter is not installed.
var errNoTF2ONNX = errors.New("tf2onnx is not available (python3 -m tf2onnx.convert failed to start)")

func runTF2ONNX(ctx context.Context, dir string, o *importOptions) error {
	py, err := execx.LookPath("python3", "")
	if err != nil {
		return errNoTF2ONNX
	}
	var x execx.Exec
	if _, err := x.Run(ctx, execx.Cmd{Path: py, Args: []string{"-c", "import tf2onnx"}}); err != nil {
		return errNoTF2ONNX
	}
	_, err = x.Run(ctx, execx.Cmd{Path: py, Args: []string{"-m", "tf2onnx.convert", "--saved-model", dir,
		"--output", o.output, "--opset", strconv.FormatInt(o.opset, 10), "--tag", o.tags, "--signature_def", o.signature}})
	if err != nil {
		return fmt.Errorf("tf2onnx on %s: %w", dir, err)
	}
	return nil
}

func printImport(w io.Writer, format string, r *importResult) error {
	if format == formatJSON {
		return json.NewEncoder(w).Encode(r)
	}
	fmt.Fprintf(w, "%s -> %s (signature %s, tags %s, %s)\n", r.Source, r.Output, r.Signature, r.Tags, r.Converter)
	for _, m := range r.Inputs {
		fmt.Fprintf(w, "  input  %-20s %s %s  (signature %s, tensor %s)\n", m.ONNX, m.DType, mappingShape(m), m.Key, m.Tensor)
	}
	for _, m := range r.Outputs {
		fmt.Fprintf(w, "  output %-20s %s %s  (signature %s, tensor %s)\n", m.ONNX, m.DType, mappingShape(m), m.Key, m.Tensor)
	}
	return nil
}

// mappingShape writes an argument's shape, -1 dynamic, and where it came
// from when not the signature.
func mappingShape(m savedmodel.NameMapping) string {
	s := "unknown rank"
	if !m.UnknownRank {
		s = strings.ReplaceAll(fmt.Sprint(m.Shape), " ", ",")
	}
	if m.ShapeFrom != "" && m.ShapeFrom != savedmodel.ShapeFromSignature {
		s += " (" + m.ShapeFrom + ")"
	}
	return s
}

func init() {
	advisors = append(advisors, func(err error) string {
		var u *savedmodel.UnsupportedOpsError
		switch {
		case errors.As(err, &u):
			return "these ops have no ONNX mapping in kiln yet; retry with --tf2onnx to use the external tf2onnx converter"
		case errors.Is(err, errNoTF2ONNX):
			return "install it with `pip install tf2onnx tensorflow`, or drop --tf2onnx to use kiln's own importer"
		}
		return ""
	})
}
