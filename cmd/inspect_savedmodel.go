package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/savedmodel"
)

// savedModelResult is what inspect prints for a SavedModel: each
// MetaGraphDef's tags and signatures, as `saved_model_cli show --all` lists
// them.
type savedModelResult struct {
	Path string `json:"path"`
	// Dir is the directory holding saved_model.pb; Version its version
	// directory's number, absent when the path itself is the model.
	Dir        string          `json:"dir"`
	Version    *int64          `json:"version,omitempty"`
	MetaGraphs []metaGraphInfo `json:"meta_graphs"`
	// Variables is the number of tensors in the variables bundle.
	Variables int `json:"variables"`
}

type metaGraphInfo struct {
	Tags              []string               `json:"tags"`
	TensorflowVersion string                 `json:"tensorflow_version,omitempty"`
	Signatures        []savedmodel.Signature `json:"signatures"`
}

// savedModelArgs reports whether the arguments name SavedModels
// (directories or gs:// prefixes) rather than ONNX files; a mix is refused.
func savedModelArgs(args []string) (bool, error) {
	n := 0
	for _, a := range args {
		if st, err := os.Stat(a); strings.HasPrefix(a, "gs://") || (err == nil && st.IsDir()) {
			n++
		}
	}
	if n > 0 && n < len(args) {
		return false, usageErr(errors.New("inspect takes ONNX files or SavedModel directories, not both in one call"))
	}
	return n > 0, nil
}

// importForRun imports each SavedModel for --run, as convert does, and
// returns the ONNX files.
func (o *inspectOptions) importForRun(ctx context.Context, paths []string) ([]string, error) {
	o.feed.batch = max(o.batch, 1)
	spec, err := o.feed.spec()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range paths {
		f, _, err := importedSource(ctx, p, spec.Shapes)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// inspectSavedModels describes each SavedModel and prints the results.
func (o *inspectOptions) inspectSavedModels(ctx context.Context, w io.Writer, paths []string) error {
	var results []savedModelResult
	for _, p := range paths {
		r, err := inspectSavedModel(ctx, p)
		if err != nil {
			if errors.Is(err, savedmodel.ErrNoSavedModel) && !strings.HasPrefix(p, "gs://") {
				return fmt.Errorf("%s is a directory and not a SavedModel: %w", p, err)
			}
			return err
		}
		results = append(results, r)
	}
	return printResults(w, o.format, results, printSavedModel)
}

func inspectSavedModel(ctx context.Context, path string) (savedModelResult, error) {
	fsys, done, err := dataFS(ctx, path)
	if err != nil {
		return savedModelResult{}, err
	}
	defer done()
	m, err := savedmodel.Open(ctx, path, fsys)
	if err != nil {
		return savedModelResult{}, err
	}
	r := savedModelResult{Path: path, Dir: m.Dir}
	if m.Version != savedmodel.NoVersion {
		r.Version = &m.Version
	}
	for _, mg := range m.Proto.GetMetaGraphs() {
		info := mg.GetMetaInfoDef()
		r.MetaGraphs = append(r.MetaGraphs, metaGraphInfo{
			Tags: append([]string{}, info.GetTags()...), TensorflowVersion: info.GetTensorflowVersion(),
			Signatures: savedmodel.ListSignatures(mg),
		})
	}
	b, err := m.Bundle(ctx)
	if err != nil {
		return savedModelResult{}, err
	}
	r.Variables = len(b.Keys())
	return r, nil
}

// printSavedModel prints a SavedModel in the layout of
// `saved_model_cli show --all`.
func printSavedModel(w io.Writer, r savedModelResult) {
	fmt.Fprintf(w, "SavedModel: %s", r.Dir)
	if r.Version != nil {
		fmt.Fprintf(w, " (version %d)", *r.Version)
	}
	fmt.Fprintf(w, "\nvariables:  %d\n", r.Variables)
	for _, mg := range r.MetaGraphs {
		fmt.Fprintf(w, "\nMetaGraphDef with tag-set: '%s' contains the following SignatureDefs:\n", strings.Join(mg.Tags, ", "))
		for _, s := range mg.Signatures {
			fmt.Fprintf(w, "\nsignature_def['%s']:\n", s.Key)
			fmt.Fprintln(w, "  The given SavedModel SignatureDef contains the following input(s):")
			printTensorSpecs(w, "inputs", s.Inputs)
			fmt.Fprintln(w, "  The given SavedModel SignatureDef contains the following output(s):")
			printTensorSpecs(w, "outputs", s.Outputs)
			fmt.Fprintf(w, "  Method name is: %s\n", s.Method)
		}
	}
}

func printTensorSpecs(w io.Writer, kind string, specs []savedmodel.TensorSpec) {
	for _, t := range specs {
		fmt.Fprintf(w, "    %s['%s'] tensor_info:\n", kind, t.Key)
		fmt.Fprintf(w, "        dtype: %s\n", t.DType)
		fmt.Fprintf(w, "        shape: %s\n", specShape(t))
		if t.Encoding != "" {
			fmt.Fprintf(w, "        encoding: %s\n", t.Encoding)
		} else {
			fmt.Fprintf(w, "        name: %s\n", t.Name)
		}
	}
}

// specShape writes a shape as saved_model_cli does: (-1, 1), () for a
// scalar, unknown_rank.
func specShape(t savedmodel.TensorSpec) string {
	if t.UnknownRank {
		return "unknown_rank"
	}
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = strconv.FormatInt(d, 10)
	}
	return "(" + strings.Join(dims, ", ") + ")"
}
