package cmd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// pipeline is the part of a pipeline file (kiln run -f pipeline.yaml) that
// the stage commands read. Values given as flags win over the file.
type pipeline struct {
	Model      string `yaml:"model"`
	Repository string `yaml:"repository"`
	// Variants are variant IDs ("trt-int8-b16-x4") or mappings with
	// runtime, precision, max_batch and instances.
	Variants []string `yaml:"-"`
}

type pipelineVariant struct {
	Runtime   string `yaml:"runtime"`
	Precision string `yaml:"precision"`
	MaxBatch  int    `yaml:"max_batch"`
	Instances int    `yaml:"instances"`
	Target    string `yaml:"target"`
}

// readPipeline reads a pipeline file strictly: unknown keys are errors that
// name the file and line.
func readPipeline(path string) (*pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw struct {
		Model      string      `yaml:"model"`
		Repository string      `yaml:"repository"`
		Variants   []yaml.Node `yaml:"variants"`
		Calibrate  yaml.Node   `yaml:"calibrate"`
		Convert    yaml.Node   `yaml:"convert"`
		Pack       yaml.Node   `yaml:"pack"`
		Serve      yaml.Node   `yaml:"serve"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("reading pipeline %s: %w", path, err)
	}
	p := &pipeline{Model: raw.Model, Repository: raw.Repository}
	for i, n := range raw.Variants {
		switch n.Kind {
		case yaml.ScalarNode:
			p.Variants = append(p.Variants, n.Value)
		case yaml.MappingNode:
			var v pipelineVariant
			if err := n.Decode(&v); err != nil {
				return nil, fmt.Errorf("%s:%d: variants[%d]: %w", path, n.Line, i, err)
			}
			if v.Runtime == "" || v.Precision == "" {
				return nil, fmt.Errorf("%s:%d: variants[%d] needs runtime and precision", path, n.Line, i)
			}
			id := v.Runtime + "-" + v.Precision
			if v.MaxBatch > 0 {
				id += "-b" + strconv.Itoa(v.MaxBatch)
			}
			if v.Instances > 1 {
				id += "-x" + strconv.Itoa(v.Instances)
			}
			if v.Target != "" {
				id += "-sm" + strings.ReplaceAll(v.Target, ".", "")
			}
			p.Variants = append(p.Variants, id)
		default:
			return nil, fmt.Errorf("%s:%d: variants[%d] must be an ID like trt-int8-b16 or a mapping", path, n.Line, i)
		}
	}
	return p, nil
}
