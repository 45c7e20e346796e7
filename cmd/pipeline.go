package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kiln-ml/kiln/manifest"
)

// pipeline is what the stage commands read of a pipeline file (kiln
// convert -f pipeline.yaml). Flags win over the file. The file is decoded
// strictly: a section or field kiln does not read yet is an error naming
// its line, never silently ignored.
type pipeline struct {
	// Model is the source model, relative to the file's directory; convert
	// uses it when no MODEL argument is given.
	Model string
	// Repository is the model repository to write, relative to the file's
	// directory; convert uses it when --repo is not given.
	Repository string
	// Variants are what to build, from IDs ("trt-int8-b16-x4") or mappings
	// with runtime, precision, max_batch, instances and target.
	Variants []manifest.Variant
}

// pipelineFields are the top-level keys a pipeline file may have.
var pipelineFields = []string{"model", "repository", "variants"}

// variantFields are the keys of a variant written as a mapping.
var variantFields = []string{"runtime", "precision", "max_batch", "instances", "target"}

// readPipeline reads and checks a pipeline file; errors name the file and line.
func readPipeline(path string) (*pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading pipeline: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("reading pipeline %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("pipeline %s is empty", path)
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: a pipeline is a mapping of %s", path, top.Line, strings.Join(pipelineFields, ", "))
	}
	fields, err := mappingFields(path, "", top, pipelineFields)
	if err != nil {
		return nil, err
	}
	p := &pipeline{}
	dir := filepath.Dir(path)
	for key, dst := range map[string]*string{"model": &p.Model, "repository": &p.Repository} {
		if n := fields[key]; n != nil {
			if n.Kind != yaml.ScalarNode || n.Value == "" {
				return nil, fmt.Errorf("%s:%d: %s must be a path", path, n.Line, key)
			}
			*dst = n.Value
			if !filepath.IsAbs(n.Value) && !strings.HasPrefix(n.Value, "gs://") {
				*dst = filepath.Join(dir, n.Value)
			}
		}
	}
	if n := fields["variants"]; n != nil {
		if p.Variants, err = pipelineVariants(path, n); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// mappingFields returns the values of a mapping by key, refusing keys not
// in known and keys given twice.
func mappingFields(path, where string, m *yaml.Node, known []string) (map[string]*yaml.Node, error) {
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		switch {
		case !slices.Contains(known, k.Value):
			return nil, fmt.Errorf("%s:%d: %s%q is not a setting kiln reads (it reads %s)", path, k.Line, where, k.Value, strings.Join(known, ", "))
		case out[k.Value] != nil:
			return nil, fmt.Errorf("%s:%d: %s%q is given twice", path, k.Line, where, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

// pipelineVariants reads the variants: list. A variant is an ID or a
// mapping; both become manifest.Variant, whose ID is built in one place.
func pipelineVariants(path string, n *yaml.Node) ([]manifest.Variant, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s:%d: variants must be a list", path, n.Line)
	}
	var out []manifest.Variant
	for i, item := range n.Content {
		where := fmt.Sprintf("variants[%d]", i)
		var v manifest.Variant
		var err error
		switch item.Kind {
		case yaml.ScalarNode:
			v, err = manifest.ParseVariant(item.Value)
		case yaml.MappingNode:
			v, err = variantMapping(path, where, item)
		default:
			err = fmt.Errorf("want an ID like trt-int8-b16 or a mapping of %s", strings.Join(variantFields, ", "))
		}
		if err == nil {
			err = v.Validate()
		}
		if err != nil {
			if strings.HasPrefix(err.Error(), path+":") {
				return nil, err
			}
			return nil, fmt.Errorf("%s:%d: %s: %w", path, item.Line, where, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// variantMapping reads {runtime, precision, max_batch, instances, target}.
func variantMapping(path, where string, m *yaml.Node) (manifest.Variant, error) {
	fields, err := mappingFields(path, where+".", m, variantFields)
	if err != nil {
		return manifest.Variant{}, err
	}
	var raw struct {
		Runtime   string `yaml:"runtime"`
		Precision string `yaml:"precision"`
		MaxBatch  int    `yaml:"max_batch"`
		Instances int    `yaml:"instances"`
		Target    string `yaml:"target"`
	}
	if err := m.Decode(&raw); err != nil {
		return manifest.Variant{}, err
	}
	if fields["runtime"] == nil || fields["precision"] == nil {
		return manifest.Variant{}, fmt.Errorf("needs runtime and precision")
	}
	return manifest.NewVariant(raw.Runtime, raw.Precision, raw.MaxBatch, raw.Instances, raw.Target)
}
