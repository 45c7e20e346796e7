package convert

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// Matrix is the variant cross product asked for on the command line:
// --precision fp32,fp16 --runtime onnx,trt --max-batch 1,16 --instances 1,4.
type Matrix struct {
	Precisions []manifest.Precision
	Runtimes   []manifest.Runtime
	MaxBatches []int // 0 means the model's default
	Instances  []int // 0 or 1 means one instance
	Target     string
}

// ParseMatrix reads the comma-separated flag values; empty lists get the
// defaults (fp32 on onnx, default batch, one instance).
func ParseMatrix(precisions, runtimes, maxBatches, instances []string) (Matrix, error) {
	var m Matrix
	var errs []error
	for _, s := range splitAll(precisions) {
		p, err := manifest.ParsePrecision(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--precision: %w", err))
			continue
		}
		m.Precisions = append(m.Precisions, p)
	}
	for _, s := range splitAll(runtimes) {
		r, err := manifest.ParseRuntime(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--runtime: %w", err))
			continue
		}
		m.Runtimes = append(m.Runtimes, r)
	}
	ints := func(flag string, vals []string, min int) []int {
		var out []int
		for _, s := range splitAll(vals) {
			n, err := strconv.Atoi(s)
			if err != nil || n < min {
				errs = append(errs, fmt.Errorf("%s: %q is not an integer >= %d", flag, s, min))
				continue
			}
			out = append(out, n)
		}
		return out
	}
	m.MaxBatches = ints("--max-batch", maxBatches, 0)
	m.Instances = ints("--instances", instances, 1)
	if len(m.Precisions) == 0 {
		m.Precisions = []manifest.Precision{manifest.FP32}
	}
	if len(m.Runtimes) == 0 {
		m.Runtimes = []manifest.Runtime{manifest.RuntimeONNX}
	}
	if len(m.MaxBatches) == 0 {
		m.MaxBatches = []int{0}
	}
	if len(m.Instances) == 0 {
		m.Instances = []int{1}
	}
	return m, errors.Join(errs...)
}

func splitAll(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// Expand returns the cross product in a stable order (runtime, precision,
// batch, instances), without duplicates.
func (m Matrix) Expand() []manifest.Variant {
	seen := map[string]bool{}
	var out []manifest.Variant
	for _, r := range m.Runtimes {
		for _, p := range m.Precisions {
			for _, b := range m.MaxBatches {
				for _, n := range m.Instances {
					v := manifest.Variant{Runtime: r, Precision: p, MaxBatch: b, Instances: n, Target: m.Target}
					if v.Instances == 1 {
						v.Instances = 0
					}
					if !seen[v.ID()] {
						seen[v.ID()] = true
						out = append(out, v)
					}
				}
			}
		}
	}
	return out
}

// Plan is a checked list of variants for one model.
type Plan struct {
	Variants []manifest.Variant
	// Batchable says Triton can batch the model (dynamic first dimension on
	// every input and output).
	Batchable bool
}

// PlanOptions say what the variants may use.
type PlanOptions struct {
	// HaveCalibration is true when a Q/DQ model or calibration cache from
	// `kiln calibrate` is available (or calibration data is given).
	HaveCalibration bool
	// RandomRanges allows perf-only int8 TensorRT engines without calibration.
	RandomRanges bool
}

// CheckPlan validates variants against the model: known precisions and
// runtimes, int8 only with calibration (or explicitly random ranges, for
// TensorRT only), and batch sizes the model can take.
func CheckPlan(m *onnx.Model, variants []manifest.Variant, o PlanOptions) (*Plan, error) {
	if len(variants) == 0 {
		return nil, errors.New("no variants requested")
	}
	verdict := onnx.BatchOf(m.Inputs(), m.Outputs())
	p := &Plan{Batchable: verdict.Batchable}
	var errs []error
	seen := map[string]bool{}
	for _, v := range variants {
		if err := v.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("variant %s: %w", v.ID(), err))
			continue
		}
		if seen[v.ID()] {
			continue
		}
		seen[v.ID()] = true
		if v.Precision == manifest.INT8 && !o.HaveCalibration {
			if !o.RandomRanges || v.Runtime != manifest.RuntimeTRT {
				errs = append(errs, fmt.Errorf("variant %s: int8 needs calibration: run `kiln calibrate` and pass --calib-dir, or give --calib-data (--int8-random-ranges builds perf-only TensorRT engines)", v.ID()))
				continue
			}
		}
		if v.MaxBatch > 0 && !verdict.Batchable {
			errs = append(errs, fmt.Errorf("variant %s: max batch %d, but the model cannot batch: %s", v.ID(), v.MaxBatch, verdict.Reason))
			continue
		}
		p.Variants = append(p.Variants, v)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.SliceStable(p.Variants, func(i, j int) bool { return p.Variants[i].ID() < p.Variants[j].ID() })
	return p, nil
}
