package convert

import (
	"errors"
	"fmt"
	"sort"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/normalize"
)

// Matrix is the variant cross product asked for on the command line:
// --precision fp32,fp16 --runtime onnx,trt --max-batch 1,16 --instances 1,4.
// An empty list means its default: fp32, onnx, the model's default batch,
// one instance.
type Matrix struct {
	Precisions []manifest.Precision
	Runtimes   []manifest.Runtime
	MaxBatches []int // 0 means the model's default
	Instances  []int // 0 or 1 means one instance
	Target     string
}

// Expand returns the cross product in a stable order (runtime, precision,
// batch, instances), without duplicates.
func (m Matrix) Expand() []manifest.Variant {
	m = m.withDefaults()
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

// withDefaults fills the empty lists with their defaults.
func (m Matrix) withDefaults() Matrix {
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
	return m
}

// Plan is a checked list of variants for one model.
type Plan struct {
	Variants []manifest.Variant
	// Batchable says Triton can batch the model (dynamic first dimension on
	// every input and output).
	Batchable bool
}

// ErrNoCalibration is the reason int8 variants are refused without
// calibration (wrapped with the variant in a PlanError).
var ErrNoCalibration = errors.New("int8 needs calibration: no Q/DQ model or calibration cache")

// PlanError reports variants that do not fit the model or what was given
// for them: a usage error, which no rebuild fixes. Err joins one error per
// refused variant.
type PlanError struct {
	Err error
}

// Error lists the refused variants with their reasons.
func (e *PlanError) Error() string { return e.Err.Error() }

// Unwrap returns the joined errors, for errors.Is(err, ErrNoCalibration).
func (e *PlanError) Unwrap() error { return e.Err }

// PlanOptions say what the variants may use.
type PlanOptions struct {
	// HaveCalibration is true when a Q/DQ model or calibration cache from
	// `kiln calibrate` is available.
	HaveCalibration bool
	// RandomRanges allows perf-only int8 TensorRT engines without calibration.
	RandomRanges bool
	// SourcePrecision is what the source computes in
	// (normalize.SourcePrecision) and Why says how kiln can tell. An int8
	// source gets an int8 variant (itself, no calibration needed) and no
	// fp32 or fp16 one: their labels would be false.
	SourcePrecision normalize.Precision
	Why             string
}

// CheckPlan validates variants against the model: known precisions and
// runtimes, int8 only with calibration (or explicitly random ranges, for
// TensorRT only), and batch sizes the model can take. A refusal is a
// *PlanError.
func CheckPlan(m *onnx.Model, variants []manifest.Variant, o PlanOptions) (*Plan, error) {
	if len(variants) == 0 {
		return nil, &PlanError{Err: errors.New("no variants requested")}
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
		if o.SourcePrecision == normalize.PrecisionINT8 {
			if v.Precision != manifest.INT8 {
				errs = append(errs, fmt.Errorf("variant %s: the source is already quantized (%s); a %s variant of it would carry a false label: convert the model it was quantized from, or ask for int8", v.ID(), o.Why, v.Precision))
				continue
			}
		} else if v.Precision == manifest.INT8 && !o.HaveCalibration {
			if !o.RandomRanges || v.Runtime != manifest.RuntimeTRT {
				errs = append(errs, fmt.Errorf("variant %s: %w", v.ID(), ErrNoCalibration))
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
		return nil, &PlanError{Err: err}
	}
	sortVariants(p.Variants)
	return p, nil
}

// sortVariants puts variants in the order they are built and reported.
func sortVariants(vs []manifest.Variant) {
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].ID() < vs[j].ID() })
}
