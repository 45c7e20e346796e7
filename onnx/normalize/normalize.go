// Package normalize checks an ONNX model the way ONNX Runtime would and
// rewrites what users bring into the clean fp32 graph kiln's stages start
// from (DESIGN.md "Real models in: the source normalizer"): Constant nodes
// become initializers, input-free subgraphs are folded, inputs fixed to a
// value are folded in, fp16 storage and fp16 compute between Casts are
// raised to fp32, BatchNormalization is folded into the preceding
// Conv/Gemm, and old opsets are upgraded. Every pass reports what it
// changed, so convert and calibrate can say it and record it in kiln.json.
//
// It is a building block: convert and calibrate call it; it uses onnx and,
// to fold subgraphs and to test its rewrites, ort.
package normalize

import (
	"context"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// Options choose the passes. The zero value runs the passes that never
// change a model's outputs (Constant nodes, folding, BatchNormalization
// folding, the opset upgrade where calibration needs it) and leaves the
// precision alone.
type Options struct {
	// Fix folds graph inputs to values (Silero VAD's sr=16000): the input
	// disappears, and If nodes whose condition it decides are replaced by
	// their branch.
	Fix map[string]*onnx.Tensor
	// RaiseFP16 rewrites fp16 storage and fp16 compute to fp32 end to end
	// (an fp32 variant of a mixed-precision model computes in fp32).
	RaiseFP16 bool
	// MinOpset upgrades the default domain to at least this opset (0:
	// keep the model's).
	MinOpset int64
	// NoFoldBatchNorm keeps BatchNormalization nodes as they are.
	NoFoldBatchNorm bool
}

// Pass is what one pass did.
type Pass struct {
	Name string `json:"name"` // "constants", "fold", "fix", "fp16-raise", "batchnorm", "opset"
	// Changed counts what the pass rewrote (nodes folded, tensors raised).
	Changed int `json:"changed"`
	// Summary is the sentence the commands print: "folded 38 Constant
	// nodes into initializers", "upgraded opset 9 to 13".
	Summary string `json:"summary"`
}

// Report lists the passes that changed something, in the order they ran.
type Report struct {
	Passes []Pass `json:"passes,omitempty"`
}

// Summaries lists the passes' summaries, for kiln.json.
func (r *Report) Summaries() []string {
	s := make([]string, len(r.Passes))
	for i, p := range r.Passes {
		s[i] = p.Summary
	}
	return s
}

// String joins the passes' summaries.
func (r *Report) String() string {
	s := make([]string, len(r.Passes))
	for i, p := range r.Passes {
		s[i] = p.Summary
	}
	return strings.Join(s, "; ")
}

// CheckError says that ONNX Runtime would refuse the model, and why.
type CheckError struct {
	Path   string // the model file, when known
	Reason string // "the model has no opset_import", "node Conv_3 reads x, which nothing defines"
}

func (e *CheckError) Error() string {
	if e.Path == "" {
		return "invalid model: " + e.Reason
	}
	return fmt.Sprintf("%s is not a valid ONNX model: %s", e.Path, e.Reason)
}

// pass is one step of Normalize: it edits m in place and says what it did
// (Changed 0 when nothing applied).
type pass func(ctx context.Context, m *onnx.Model, o Options) (Pass, error)

// passes is the order Normalize runs them in; each file of this package
// adds its own (see its init).
var passes []struct {
	order int
	run   pass
}

// register adds a pass; order sorts them (constants 10, fix 20, fold 30,
// fp16-raise 40, batchnorm 50, opset 60).
func register(order int, p pass) {
	passes = append(passes, struct {
		order int
		run   pass
	}{order, p})
	for i := len(passes) - 1; i > 0 && passes[i].order < passes[i-1].order; i-- {
		passes[i], passes[i-1] = passes[i-1], passes[i]
	}
}

// Normalize checks m (Check) and runs the passes on a copy of it, returning
// the normalized model and what changed. m is not modified.
func Normalize(ctx context.Context, m *onnx.Model, o Options) (*onnx.Model, *Report, error) {
	if err := Check(m); err != nil {
		return nil, nil, err
	}
	out := clone(m)
	rep := &Report{}
	for _, p := range passes {
		r, err := p.run(ctx, out, o)
		if err != nil {
			return nil, nil, fmt.Errorf("normalizing: %w", err)
		}
		if r.Changed > 0 {
			rep.Passes = append(rep.Passes, r)
		}
	}
	return out, rep, nil
}

// clone copies m; initializer data is copied too (proto.Clone), so the
// passes may edit it.
func clone(m *onnx.Model) *onnx.Model {
	return &onnx.Model{Proto: proto.Clone(m.Proto).(*onnxpb.ModelProto), Path: m.Path}
}
