package cmd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel"
)

type initOptions struct {
	output string
	force  bool
}

func newInitCmd(_ *globalOptions) *cobra.Command {
	o := &initOptions{}
	c := &cobra.Command{
		Use:   "init MODEL",
		Short: "Write a commented starter pipeline file for kiln run from a model's signature",
		Long: `init reads MODEL (an ONNX file or a TensorFlow SavedModel directory) and
writes a pipeline file for kiln run: schemaVersion 1, the source, the
model's inputs and outputs in comments, and commented examples of every
other section (calibration, variants, checks, destinations, target). Paths
in the file are relative to it. It refuses to replace an existing file
unless --force is given.`,
		Example: `  kiln init model.onnx
  kiln init saved_model/ -o resnet.yaml
  kiln init model.onnx -o pipeline.yaml --force && kiln run -f pipeline.yaml`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			text, err := starterPipeline(c.Context(), args[0], o.output)
			if err != nil {
				return err
			}
			if _, err := os.Lstat(o.output); err == nil && !o.force {
				return usageErr(fmt.Errorf("%s exists: give another -o, or --force to replace it", o.output))
			}
			if err := atomicfile.WriteFile(o.output, []byte(text), 0o644); err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.OutOrStdout(), "wrote %s: edit it, then kiln run -f %s\n", o.output, o.output)
			return err
		},
	}
	c.Flags().StringVarP(&o.output, "output", "o", "pipeline.yaml", "pipeline `FILE` to write")
	c.Flags().BoolVar(&o.force, "force", false, "replace the file when it exists")
	return c
}

// starterData fills the starter template.
type starterData struct {
	Source  string   // relative to the file
	Name    string   // base model name
	Inputs  []string // "name  TYPE  SHAPE" lines
	Outputs []string
	Image   bool // an input looks like an image batch (4-D float)
}

// starterPipeline writes the starter file for model, to be saved at out.
func starterPipeline(ctx context.Context, model, out string) (string, error) {
	d := starterData{Source: model}
	if !filepath.IsAbs(model) && !strings.HasPrefix(model, "gs://") { // relative to the file, as kiln run reads it
		absModel, err1 := filepath.Abs(model)
		absDir, err2 := filepath.Abs(filepath.Dir(out))
		if rel, err := filepath.Rel(absDir, absModel); err1 == nil && err2 == nil && err == nil {
			d.Source = filepath.ToSlash(rel)
		}
	}
	var err error
	if isSavedModelSource(model) {
		d.Name = savedModelName(model)
		err = d.savedModelSignature(ctx, model)
	} else {
		d.Name = strings.TrimSuffix(filepath.Base(model), filepath.Ext(model))
		err = d.onnxSignature(model)
	}
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := starterTemplate.Execute(&b, d); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (d *starterData) onnxSignature(path string) error {
	m, err := onnx.LoadWith(path, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	s := onnx.Summarize(m)
	for _, t := range s.Inputs {
		d.Inputs = append(d.Inputs, fmt.Sprintf("%s  %s  %s", t.Name, typeOrKind(t), shapeText(t)))
		d.Image = d.Image || (len(t.Shape) == 4 && strings.Contains(strings.ToLower(typeOrKind(t)), "float"))
	}
	for _, t := range s.Outputs {
		d.Outputs = append(d.Outputs, fmt.Sprintf("%s  %s  %s", t.Name, typeOrKind(t), shapeText(t)))
	}
	return nil
}

func (d *starterData) savedModelSignature(ctx context.Context, path string) error {
	r, err := inspectSavedModel(ctx, path)
	if err != nil {
		return err
	}
	for _, mg := range r.MetaGraphs {
		for _, s := range mg.Signatures {
			if s.Key != savedmodel.DefaultSignature {
				continue
			}
			for _, t := range s.Inputs {
				d.Inputs = append(d.Inputs, fmt.Sprintf("%s  %s  %s", t.Key, t.DType, specShape(t)))
				d.Image = d.Image || (len(t.Shape) == 4 && strings.Contains(strings.ToLower(t.DType), "float"))
			}
			for _, t := range s.Outputs {
				d.Outputs = append(d.Outputs, fmt.Sprintf("%s  %s  %s", t.Key, t.DType, specShape(t)))
			}
			return nil
		}
	}
	return fmt.Errorf("%s has no %s signature: kiln import --signature converts another one to ONNX, then kiln init the ONNX", path, savedmodel.DefaultSignature)
}

var starterTemplate = template.Must(template.New("pipeline").Parse(`# yaml-language-server: $schema=https://raw.githubusercontent.com/kiln-ml/kiln/main/testdata/pipeline.schema.json
# kiln run -f this file takes the model through import, calibrate, convert,
# serve and pack. Paths are relative to this file. Flags and KILN_*
# variables override what it says (kiln run --help).
schemaVersion: 1
source: {{.Source}}
# inputs:
{{- range .Inputs}}
#   {{.}}
{{- end}}
# outputs:
{{- range .Outputs}}
#   {{.}}
{{- end}}

# Data int8 ranges are calibrated on; int8 variants need it.
# calibration:
{{- if .Image}}
#   data: images/            # .jpg/.png, or .npy/.npz, .pb, .tfrecord, KServe .json; local or gs://
#   preprocess: imagenet     # or resize=256,crop=224,scale=1/255,mean=...,std=...
{{- else}}
#   data: inputs.npz         # .npy/.npz, .pb, .tfrecord or KServe .json; local or gs://
{{- end}}
#   samples: 512             # drawn for calibration and validation together (0: all)
#   method: entropy          # entropy, minmax, percentile or mse

# What to build: IDs (runtime-precision[-b<max batch>][-x<instances>]) or mappings.
variants:
  - onnx-fp32
  - onnx-fp16
#  - onnx-int8               # needs calibration:
#  - {runtime: trt, precision: fp16, max_batch: 16, instances: 2}

# What serve checks with (default: the calibration's validation split).
# checks:
#   data: val/
#   thresholds: [cosine=0.999]
#   window: 1s

repository: models/{{.Name}}
# name: {{.Name}}            # base model name of the repository's models
# report: models/{{.Name}}-report

# Where pack publishes, verified by digest.
# destinations:
#   - dir:/srv/models
#   - oci-layout:oci/{{.Name}}
#   - image:registry.example.com/models/{{.Name}}:1
#   - gs://bucket/models/{{.Name}}
# base: scratch              # image destinations without Triton (KServe modelcar)

# The GPU and TensorRT the engines are for.
# target:
#   gpu: sm89
#   tensorrt: "10.3"
#   gpu_types: [nvidia-l4]    # kiln plan -f: build every variant on these GPU types

# kiln plan -f: the GKE and Cloud Run jobs that build the variants.
# plan:
#   cache: gs://bucket/kiln-cache
#   image: registry.example.com/kiln/kiln:1
#   project: my-project
#   region: europe-west4
`))
