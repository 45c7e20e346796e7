package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kiln-ml/kiln/calibrate"
	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pack"
	"github.com/kiln-ml/kiln/workflows"
)

// pipelineSchemaVersion is the schemaVersion this kiln reads.
const pipelineSchemaVersion = 1

// pipeline is a pipeline file: what kiln run takes a model through, and
// what kiln convert -f reads of it (source, repository, variants). Flags
// and KILN_* variables win over the file. The file is decoded strictly: a
// field kiln does not read is an error naming its line, never ignored. The
// doc tags describe the fields in the JSON Schema (pipeline.schema.json).
type pipeline struct {
	SchemaVersion int                  `yaml:"schemaVersion" doc:"version of this file's format; 1"`
	Source        string               `yaml:"source" doc:"the model: an ONNX file or a TensorFlow SavedModel directory, local or gs://; relative to this file"`
	Model         string               `yaml:"model" doc:"older name of source"`
	Shapes        []string             `yaml:"shapes" doc:"shapes for SavedModel inputs the signature leaves without a rank, as kiln import --shape: NAME=DIMS, -1 a dynamic dimension, e.g. X=-1"`
	Calibration   *pipelineCalibration `yaml:"calibration" doc:"data int8 ranges are calibrated on (needed by int8 variants)"`
	Variants      []pipelineVariant    `yaml:"variants" doc:"what to build: IDs such as trt-int8-b16-x4, or mappings (default onnx-fp32)"`
	Checks        *pipelineChecks      `yaml:"checks" doc:"what kiln serve checks the repository with, and how strictly"`
	Repository    string               `yaml:"repository" doc:"the model repository directory to write, relative to this file"`
	Name          string               `yaml:"name" doc:"base model name of the repository's models (default: the source's file name)"`
	Version       int64                `yaml:"version" doc:"model version directory (1, the one convert writes)"`
	Labels        string               `yaml:"labels" doc:"label file placed next to each config, relative to this file"`
	Destinations  []string             `yaml:"destinations" doc:"where kiln pack publishes: dir:PATH, oci-layout:PATH[:TAG], oci-archive:FILE.tar[:TAG], image:REF or gs://BUCKET/PREFIX (paths relative to this file)"`
	Base          string               `yaml:"base" doc:"base image of image and OCI destinations (default: the Triton image pack names); scratch: a model-only image (KServe modelcar)"`
	Target        *pipelineTarget      `yaml:"target" doc:"the GPU and TensorRT the engines are for"`
	Plan          *pipelinePlan        `yaml:"plan" doc:"where kiln plan's GKE and Cloud Run jobs build the variants (kiln plan -f)"`
	Report        string               `yaml:"report" doc:"directory for serve's report.html, report.md and report.json (default: <repository>.report)"`

	path  string         // the file read
	lines map[string]int // line of each field, by its path (checks.data)
}

// pipelineCalibration is calibration:, kiln calibrate's data flags.
type pipelineCalibration struct {
	Data       string `yaml:"data" doc:"calibration data: a directory or file of images, .npy/.npz, .pb, .tfrecord or KServe .json; local or gs://; relative to this file"`
	Preprocess string `yaml:"preprocess" doc:"image preprocessing: a preset (imagenet, inception, caffe) and/or key=value items, e.g. scale=1/255"`
	Method     string `yaml:"method" doc:"range method: entropy (default), minmax, percentile or mse"`
	Samples    int    `yaml:"samples" doc:"samples drawn, for calibration and validation together (0: all)"`
	Seed       int64  `yaml:"seed" doc:"seed for drawing samples"`
}

// pipelineChecks is checks:, what serve checks with.
type pipelineChecks struct {
	Data       string   `yaml:"data" doc:"validation data (default: the calibration's validation split, else seeded random data)"`
	Preprocess string   `yaml:"preprocess" doc:"image preprocessing of data"`
	Thresholds []string `yaml:"thresholds" doc:"threshold overrides: [MODEL[/OUTPUT]:]METRIC=VALUE"`
	Perf       *bool    `yaml:"perf" doc:"measure latency and throughput (default true)"`
	Window     string   `yaml:"window" doc:"measurement window per concurrency and batch size (default 1s)"`
}

// pipelineTarget is target:.
type pipelineTarget struct {
	GPU      string   `yaml:"gpu" doc:"compute capability the engines are for: 8.9 or sm89"`
	TensorRT string   `yaml:"tensorrt" doc:"TensorRT release the engines are for: 10.3 accepts any 10.3.x"`
	GPUTypes []string `yaml:"gpu_types" doc:"GPU types kiln plan builds every variant on, one build job each (TensorRT engines for each type's compute capability): nvidia-l4, nvidia-rtx-pro-6000, ..."`
}

// pipelinePlan is plan:, what kiln plan's jobs run with.
type pipelinePlan struct {
	Cache   string `yaml:"cache" doc:"build cache gs://BUCKET/PREFIX every job reads and writes"`
	Image   string `yaml:"image" doc:"kiln image the jobs run, with trtexec for TensorRT variants"`
	Project string `yaml:"project" doc:"Google Cloud project of the Cloud Run jobs"`
	Region  string `yaml:"region" doc:"Cloud Run region of the Cloud Run jobs"`
}

// pipelineVariant is one variants: item, an ID or a mapping.
type pipelineVariant struct {
	manifest.Variant
}

// variantFields are the keys of a variant written as a mapping.
var variantFields = []string{"runtime", "precision", "max_batch", "instances", "target"}

// lineError is an error at a line of the file being read.
type lineError struct {
	line int
	err  error
}

func (e *lineError) Error() string { return fmt.Sprintf("%d: %v", e.line, e.err) }

// readPipeline reads and checks a pipeline file; errors name the file,
// line and field. Relative paths are made relative to the file's directory.
func readPipeline(path string) (*pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading pipeline: %w", err)
	}
	p, err := decodePipeline(data)
	var le *lineError
	switch {
	case errors.As(err, &le):
		return nil, fmt.Errorf("%s:%d: %w", path, le.line, le.err)
	case err != nil:
		return nil, fmt.Errorf("pipeline %s: %w", path, err)
	}
	p.path = path
	p.resolve(filepath.Dir(path))
	return p, nil
}

// decodePipeline checks every key of data against the pipeline's fields,
// then decodes and validates it.
func decodePipeline(data []byte) (*pipeline, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, errors.New("it is empty")
	}
	top := doc.Content[0]
	p := &pipeline{lines: map[string]int{}}
	if err := checkFields(top, reflect.TypeOf(*p), "", p.lines); err != nil {
		return nil, err
	}
	if err := top.Decode(p); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 { // "line 3: cannot unmarshal ..."
			var line int
			if _, serr := fmt.Sscanf(te.Errors[0], "line %d:", &line); serr == nil {
				_, msg, _ := strings.Cut(te.Errors[0], ": ")
				for key, l := range p.lines { // name the field on that line
					if l == line && !strings.Contains(msg, key+":") {
						msg = key + ": " + msg
						break
					}
				}
				return nil, &lineError{line, errors.New(msg)}
			}
			return nil, errors.New(te.Errors[0])
		}
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkFields walks n against type t: every mapping key must be a field's
// yaml name, given once; where is the path of n ("checks.").
func checkFields(n *yaml.Node, t reflect.Type, where string, lines map[string]int) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(pipelineVariant{}) {
		_, err := parseVariantNode(n, strings.TrimSuffix(where, "."))
		return err
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			what := strings.TrimSuffix(where, ".")
			if what == "" {
				what = "a pipeline"
			}
			return &lineError{n.Line, fmt.Errorf("%s is a mapping of %s", what, strings.Join(yamlFields(t), ", "))}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f, ok := yamlField(t, k.Value)
			switch {
			case !ok:
				return &lineError{k.Line, fmt.Errorf("%s%q is not a setting kiln reads (it reads %s)", where, k.Value, strings.Join(yamlFields(t), ", "))}
			case lines[where+k.Value] != 0:
				return &lineError{k.Line, fmt.Errorf("%s%q is given twice", where, k.Value)}
			}
			lines[where+k.Value] = k.Line
			if err := checkFields(v, f.Type, where+k.Value+".", lines); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return &lineError{n.Line, fmt.Errorf("%s must be a list", strings.TrimSuffix(where, "."))}
		}
		for i, item := range n.Content {
			key := fmt.Sprintf("%s[%d]", strings.TrimSuffix(where, "."), i)
			lines[key] = item.Line
			if err := checkFields(item, t.Elem(), key+".", lines); err != nil {
				return err
			}
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return &lineError{n.Line, fmt.Errorf("%s must be a single value", strings.TrimSuffix(where, "."))}
		}
	}
	return nil
}

// yamlField returns the field of struct t named name in YAML.
func yamlField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.IsExported() && strings.Split(f.Tag.Get("yaml"), ",")[0] == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// yamlFields lists the YAML names of struct t's fields.
func yamlFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if name := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; name != "" && t.Field(i).IsExported() {
			out = append(out, name)
		}
	}
	return out
}

// UnmarshalYAML reads an ID or a {runtime, precision, max_batch,
// instances, target} mapping; both become a manifest.Variant, whose ID is
// built in one place.
func (v *pipelineVariant) UnmarshalYAML(n *yaml.Node) error {
	var err error
	v.Variant, err = parseVariantNode(n, "variant")
	return err
}

// parseVariantNode reads the variant at n; where names it in errors.
func parseVariantNode(n *yaml.Node, where string) (manifest.Variant, error) {
	var v manifest.Variant
	var err error
	switch n.Kind {
	case yaml.ScalarNode:
		v, err = manifest.ParseVariant(n.Value)
	case yaml.MappingNode:
		v, err = variantMapping(n, where)
	default:
		err = fmt.Errorf("want an ID like trt-int8-b16 or a mapping of %s", strings.Join(variantFields, ", "))
	}
	if err == nil {
		err = v.Validate()
	}
	if le := (*lineError)(nil); err != nil && !errors.As(err, &le) {
		err = &lineError{n.Line, fmt.Errorf("%s: %w", where, err)}
	}
	return v, err
}

// variantMapping reads {runtime, precision, max_batch, instances, target}.
func variantMapping(m *yaml.Node, where string) (manifest.Variant, error) {
	var raw struct {
		Runtime   string `yaml:"runtime"`
		Precision string `yaml:"precision"`
		MaxBatch  int    `yaml:"max_batch"`
		Instances int    `yaml:"instances"`
		Target    string `yaml:"target"`
	}
	if err := checkFields(m, reflect.TypeOf(raw), where+".", map[string]int{}); err != nil {
		return manifest.Variant{}, err
	}
	if err := m.Decode(&raw); err != nil {
		return manifest.Variant{}, err
	}
	if raw.Runtime == "" || raw.Precision == "" {
		return manifest.Variant{}, errors.New("needs runtime and precision")
	}
	return manifest.NewVariant(raw.Runtime, raw.Precision, raw.MaxBatch, raw.Instances, raw.Target)
}

// at is an error at the line of the field named by key.
func (p *pipeline) at(key string, err error) error {
	return &lineError{p.lines[key], fmt.Errorf("%s: %w", key, err)}
}

// validate checks the values, so a bad one fails before any work.
func (p *pipeline) validate() error {
	if p.lines["schemaVersion"] != 0 && p.SchemaVersion != pipelineSchemaVersion {
		return p.at("schemaVersion", fmt.Errorf("%d: this kiln reads schemaVersion %d", p.SchemaVersion, pipelineSchemaVersion))
	}
	if p.Source != "" && p.Model != "" {
		return p.at("model", errors.New("give source or model (its older name), not both"))
	}
	if p.Source == "" {
		p.Source, p.lines["source"] = p.Model, p.lines["model"]
	}
	for i, v := range p.Shapes {
		if _, err := check.ParseShapes([]string{v}); err != nil {
			return p.at(fmt.Sprintf("shapes[%d]", i), err)
		}
	}
	if _, err := check.ParseShapes(p.Shapes); err != nil {
		return p.at("shapes", err)
	}
	if p.Version != 0 && p.Version != 1 {
		return p.at("version", fmt.Errorf("%d: convert writes version 1", p.Version))
	}
	if c := p.Calibration; c != nil {
		if c.Data == "" {
			return p.at("calibration", errors.New("needs data"))
		}
		if _, err := dataset.ParsePreprocess(c.Preprocess); err != nil {
			return p.at("calibration.preprocess", err)
		}
		if c.Method != "" {
			if _, err := calibrate.ParseMethod(c.Method); err != nil {
				return p.at("calibration.method", err)
			}
		}
	}
	if err := p.validateChecks(); err != nil {
		return err
	}
	for i, d := range p.Destinations {
		if _, err := pack.ParseDestination(d); err != nil {
			return p.at(fmt.Sprintf("destinations[%d]", i), err)
		}
	}
	if t := p.Target; t != nil {
		if _, err := manifest.ParseComputeCapability(t.GPU); t.GPU != "" && err != nil {
			return p.at("target.gpu", err)
		}
		if _, err := manifest.ParseTRTSpec(t.TensorRT); t.TensorRT != "" && err != nil {
			return p.at("target.tensorrt", err)
		}
		for i, g := range t.GPUTypes {
			if _, err := workflows.LookupGPU(g); err != nil {
				return p.at(fmt.Sprintf("target.gpu_types[%d]", i), err)
			}
		}
	}
	if pl := p.Plan; pl != nil && pl.Cache != "" {
		if d, err := pack.ParseDestination(pl.Cache); err != nil || d.Kind != pack.KindGCS {
			return p.at("plan.cache", fmt.Errorf("%q: want gs://BUCKET/PREFIX", pl.Cache))
		}
	}
	return nil
}

func (p *pipeline) validateChecks() error {
	c := p.Checks
	if c == nil {
		return nil
	}
	if _, err := dataset.ParsePreprocess(c.Preprocess); err != nil {
		return p.at("checks.preprocess", err)
	}
	for i, s := range c.Thresholds {
		if _, err := check.ParseOverride(s); err != nil {
			return p.at(fmt.Sprintf("checks.thresholds[%d]", i), err)
		}
	}
	if c.Window != "" {
		if _, err := time.ParseDuration(c.Window); err != nil {
			return p.at("checks.window", err)
		}
	}
	return nil
}

// requireRun checks what kiln run needs beyond what convert -f does: the
// schema version, a source, and calibration data for int8 variants.
func (p *pipeline) requireRun() error {
	errAt := func(key string, err error) error {
		return fmt.Errorf("%s:%d: %w", p.path, max(p.lines[key], 1), err)
	}
	switch {
	case p.lines["schemaVersion"] == 0:
		return errAt("schemaVersion", fmt.Errorf("schemaVersion: %d is missing (the first line of a pipeline file)", pipelineSchemaVersion))
	case p.Source == "":
		return errAt("source", errors.New("source: is missing: the ONNX file or SavedModel to take through the pipeline"))
	case p.Repository == "":
		return errAt("repository", errors.New("repository: is missing: the model repository directory to write"))
	}
	for i, v := range p.Variants {
		if v.Precision == manifest.INT8 && p.Calibration == nil {
			return errAt(fmt.Sprintf("variants[%d]", i), fmt.Errorf("variants[%d]: %s needs calibration data: add calibration: {data: DIR}", i, v.ID()))
		}
	}
	return nil
}

// resolve makes the file's relative paths relative to dir.
func (p *pipeline) resolve(dir string) {
	rel := func(s *string) {
		if *s != "" && !filepath.IsAbs(*s) && !strings.HasPrefix(*s, "gs://") {
			*s = filepath.Join(dir, *s)
		}
	}
	rel(&p.Source)
	rel(&p.Repository)
	rel(&p.Labels)
	rel(&p.Report)
	if p.Calibration != nil {
		rel(&p.Calibration.Data)
	}
	if p.Checks != nil {
		rel(&p.Checks.Data)
	}
	for i, d := range p.Destinations {
		for _, kind := range []string{"dir:", "oci-layout:", "oci-archive:"} {
			if rest, ok := strings.CutPrefix(d, kind); ok && !filepath.IsAbs(rest) {
				p.Destinations[i] = kind + filepath.Join(dir, rest)
			}
		}
	}
}

// variants returns the file's variants as manifest.Variant.
func (p *pipeline) variants() []manifest.Variant {
	var out []manifest.Variant
	for _, v := range p.Variants {
		out = append(out, v.Variant)
	}
	return out
}

// pipelineSchema is the JSON Schema of the pipeline file, made from the
// pipeline types and their doc tags; testdata/pipeline.schema.json is its
// committed copy (go test ./cmd -run TestPipelineSchema -update).
func pipelineSchema() ([]byte, error) {
	s := schemaOf(reflect.TypeOf(pipeline{}))
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = "https://github.com/kiln-ml/kiln/testdata/pipeline.schema.json"
	s["title"] = "kiln pipeline file (kiln run -f)"
	s["required"] = []string{"schemaVersion"}
	s["properties"].(map[string]any)["schemaVersion"].(map[string]any)["const"] = pipelineSchemaVersion
	b, err := json.MarshalIndent(s, "", "  ")
	return append(b, '\n'), err
}

// schemaOf describes type t in JSON Schema.
func schemaOf(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeOf(pipelineVariant{}):
		props := map[string]any{}
		for _, f := range variantFields {
			props[f] = map[string]any{"type": "string"}
		}
		props["max_batch"] = map[string]any{"type": "integer", "minimum": 0}
		props["instances"] = map[string]any{"type": "integer", "minimum": 1}
		props["runtime"] = map[string]any{"enum": []string{"onnx", "trt"}}
		props["precision"] = map[string]any{"enum": []string{"fp32", "fp16", "int8"}}
		return map[string]any{"oneOf": []any{
			map[string]any{"type": "string", "description": "a variant ID: runtime-precision[-b<max batch>][-x<instances>][-sm<cc>], e.g. trt-int8-b16-x4"},
			map[string]any{"type": "object", "additionalProperties": false, "required": []string{"runtime", "precision"}, "properties": props},
		}}
	case t.Kind() == reflect.Struct:
		props := map[string]any{}
		for i := range t.NumField() {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if !f.IsExported() || name == "" {
				continue
			}
			p := schemaOf(f.Type)
			if doc := f.Tag.Get("doc"); doc != "" {
				p["description"] = doc
			}
			props[name] = p
		}
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	case t.Kind() == reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case t.Kind() == reflect.Bool:
		return map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return map[string]any{"type": "integer"}
	}
	return map[string]any{"type": "string"}
}
