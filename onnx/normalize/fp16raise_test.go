package normalize

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// precHalfAttrs computes in float16 with its constants in node attributes
// (ConstantOfShape and Constant values), fp16 value_info and fp16 graph
// input and output.
func precHalfAttrs(t testing.TB) *onnx.Model {
	t.Helper()
	b := testmodels.NewBuilder("half_attrs", 5)
	x := b.Input("x", onnx.Float16, "N", 4)
	shape := b.Init("shape", []int64{2}, []int64{1, 4})
	half := func(v ...float32) []float16.Float16 {
		h := make([]float16.Float16, len(v))
		for i, f := range v {
			h[i] = float16.Fromfloat32(f)
		}
		return h
	}
	c := b.Node("ConstantOfShape", []string{shape}, testmodels.Tensor("value", []int64{1}, half(0.5)))
	k := b.Node("Constant", nil, testmodels.Tensor("value", []int64{4}, half(1, -2, 3.5, 0.25)))
	a := b.Node("Add", []string{x, c})
	m := b.Node("Mul", []string{a, k})
	f := b.Node("Cast", []string{m}, testmodels.Int("to", int64(onnx.Float)))
	s := b.Node("Sigmoid", []string{f})
	b.Node("Cast", []string{s}, testmodels.Int("to", int64(onnx.Float16)))
	b.Rename("y")
	b.Output("y", onnx.Float16, "N", 4)
	p := b.Model(17, 8)
	p.Graph.ValueInfo = append(p.Graph.ValueInfo, onnx.TensorType(a, onnx.Float16, onnx.Shape{}))
	return precModel(t, p)
}

func TestRaiseFP16(t *testing.T) {
	tiny := precModel(t, testmodels.TinyNet(1))
	tests := []struct {
		name    string
		model   func(t testing.TB) *onnx.Model
		summary string  // a part of the pass summary
		cosine  float64 // least cosine similarity of each output with the original's
		maxAbs  float64 // largest absolute difference allowed
	}{
		{"fp16 storage behind Casts", func(t testing.TB) *onnx.Model { return precMixedStorage(t, testmodels.TinyNet(1), false) },
			"raised 10 float16 initializers and 0 float16 nodes to float32, removing 10 Casts", 1 - 1e-12, 1e-6},
		{"bf16 storage behind Casts", func(t testing.TB) *onnx.Model { return precMixedStorage(t, testmodels.TinyNet(1), true) },
			"raised 10 bfloat16 initializers and 0 bfloat16 nodes to float32, removing 10 Casts", 1 - 1e-12, 1e-6},
		{"fp16 compute between Casts", precMixedCompute, "raised 1 float16 initializers and 1 float16 nodes to float32, removing 2 Casts", 0.9999, 0.05},
		{"convert/fp16 tinynet, fp32 I/O", func(t testing.TB) *onnx.Model { return precFP16(t, tiny, true) }, "float16 initializers", 0.9999, 0.01},
		{"convert/fp16 tinynet, fp16 I/O", func(t testing.TB) *onnx.Model { return precFP16(t, tiny, false) }, "inputs, outputs and value_info entries now float32", 0.9999, 0.01},
		{"convert/fp16 resnetish", func(t testing.TB) *onnx.Model {
			return precFP16(t, precModel(t, testmodels.ResNetish(16, 1)), true)
		}, "float16 initializers", 0.9999, 0.01},
		{"fp16 attributes and value_info", precHalfAttrs, "raised 0 float16 initializers and 3 float16 nodes to float32", 0.9999, 0.01},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.model(t)
			got := precRaised(t, src, tc.summary)
			precCompareRaised(t, src, got, tc.cosine, tc.maxAbs)
		})
	}
}

// precRaised runs the fp16-raise pass on a copy of src and checks that no
// half type is left, that the graph's inputs and outputs are float32 and
// that the summary says what is expected.
func precRaised(t testing.TB, src *onnx.Model, summary string) *onnx.Model {
	t.Helper()
	m := clone(src)
	if p, err := raiseFP16Pass(context.Background(), m, Options{}); err != nil || p.Changed != 0 || !proto.Equal(m.Proto, src.Proto) {
		t.Fatalf("raiseFP16Pass without RaiseFP16 = %+v, %v; want no change", p, err)
	}
	p, err := raiseFP16Pass(context.Background(), m, Options{RaiseFP16: true})
	if err != nil {
		t.Fatalf("raiseFP16Pass: %v", err)
	}
	if p.Name != "fp16-raise" || p.Changed == 0 || !strings.Contains(p.Summary, summary) {
		t.Errorf("raiseFP16Pass = %+v; want a summary containing %q", p, summary)
	}
	t.Logf("%s", p.Summary)
	if left := halfLeft(m); len(left) > 0 {
		t.Errorf("half types left: %v", left)
	}
	// An independent look: no node may compute in a half type.
	onnx.WalkGraphs(m.Graph(), func(g *onnxpb.GraphProto) {
		for name, dt := range inferElemTypes(g, nil) {
			if precHalf(dt) {
				t.Errorf("value %q is still %s", name, dt)
			}
		}
	})
	for _, v := range append(m.Inputs(), m.Outputs()...) {
		if v.Type != onnx.Float {
			t.Errorf("graph input or output %s, want float32", v)
		}
	}
	if m.OpCounts()["Cast"] > src.OpCounts()["Cast"] {
		t.Errorf("the raised model has %d Casts, the source %d", m.OpCounts()["Cast"], src.OpCounts()["Cast"])
	}
	return m
}

// precCompareRaised runs both models in ONNX Runtime on the same seeded
// input (float16 for a float16 input of src, the same values as float32
// for got) and compares every output: cosine at least minCos, max abs at
// most maxAbs times the output's largest magnitude (at least 1).
func precCompareRaised(t testing.TB, src, got *onnx.Model, minCos, maxAbs float64) {
	t.Helper()
	in := precInputs(t, src, onnx.Undefined, 11)
	want := precRun(t, src, in)
	have := precRun(t, got, precAsFloat32(t, in))
	for name, w := range want {
		h := have[name]
		if h == nil {
			t.Fatalf("output %s is missing from the raised model", name)
		}
		if h.Type != onnx.Float {
			t.Errorf("output %s is %s, want float32", name, h.Type)
		}
		d, cos := precDiff(t, w, h)
		scale := math.Max(1, precMaxAbs(t, w))
		t.Logf("output %s: max abs %.3g (largest value %.3g), cosine %.9f", name, d, scale, cos)
		if cos < minCos || d > maxAbs*scale {
			t.Errorf("output %s: max abs %.3g, cosine %.9f; want at most %g×%.3g and at least %g", name, d, cos, maxAbs, scale, minCos)
		}
	}
}

// TestRaiseFP16RealModels converts real models to float16 (convert/fp16,
// both I/O choices) and raises them back: the result must compute in
// float32 and match the float16 model within float16 tolerance.
func TestRaiseFP16RealModels(t *testing.T) {
	for _, name := range []string{"superres_subpixel.onnx", "yolox_nano_3cls.onnx", "blazeface_front_128.onnx"} {
		for _, keepIO := range []bool{true, false} {
			t.Run(name+map[bool]string{true: " fp32 I/O", false: " fp16 I/O"}[keepIO], func(t *testing.T) {
				m, err := onnx.Load(testutil.Corpus(t, "models", "real", name))
				if err != nil {
					t.Fatal(err)
				}
				h := precFP16(t, m, keepIO)
				got := precRaised(t, h, "float16 initializers")
				precCompareRaised(t, h, got, 0.9999, 0.05)
				if p, _ := SourcePrecision(got); p != PrecisionFP32 {
					t.Errorf("SourcePrecision(raised %s) = %s, want fp32", name, p)
				}
			})
		}
	}
}

func TestRaiseFP16RefusesExternalData(t *testing.T) {
	m := precMixedStorage(t, testmodels.TinyNet(1), false)
	w := m.Graph().GetInitializer()[0]
	loc := onnxpb.TensorProto_EXTERNAL
	w.DataLocation = &loc
	w.RawData = nil
	w.ExternalData = []*onnxpb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("w.bin")}}
	_, err := raiseFP16(m)
	if err == nil || !strings.Contains(err.Error(), w.GetName()) {
		t.Errorf("raiseFP16(external %s) = %v; want an error naming the tensor", w.GetName(), err)
	}
}

// TestNormalizeRaisesThenFolds runs the whole normalizer: on the float16
// rewrite of a real model, fp16-raise (40) makes the BatchNormalization
// parameters float32 initializers, so batchnorm (50) can fold them.
func TestNormalizeRaisesThenFolds(t *testing.T) {
	src, err := onnx.Load(testutil.NPMModel(t, "ch_ppocr_mobile_v2.0_cls_infer.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	h := precFP16(t, src, true)
	before := proto.Clone(h.Proto)
	defer func() {
		if !proto.Equal(before, h.Proto) {
			t.Errorf("Normalize changed its input model")
		}
	}()
	tests := []struct {
		opts   Options
		passes []string // names of the passes that must report
		bn     int      // BatchNormalization nodes left
		want   Precision
	}{
		{Options{}, []string{"constants"}, 35, PrecisionFP16},
		{Options{RaiseFP16: true}, []string{"constants", "fp16-raise", "batchnorm"}, 0, PrecisionFP32},
		{Options{RaiseFP16: true, NoFoldBatchNorm: true}, []string{"fp16-raise"}, 35, PrecisionFP32},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%+v", tc.opts), func(t *testing.T) {
			out, rep, err := Normalize(context.Background(), h, tc.opts)
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			t.Logf("%s", rep)
			names := map[string]bool{}
			for _, p := range rep.Passes {
				names[p.Name] = true
			}
			for _, n := range tc.passes {
				if !names[n] {
					t.Errorf("Normalize(%+v) report %q has no %s pass", tc.opts, rep, n)
				}
			}
			if n := out.OpCounts()["BatchNormalization"]; n != tc.bn {
				t.Errorf("Normalize(%+v) left %d BatchNormalization nodes, want %d", tc.opts, n, tc.bn)
			}
			if p, reason := SourcePrecision(out); p != tc.want {
				t.Errorf("SourcePrecision(normalized) = %s (%s), want %s", p, reason, tc.want)
			}
			if tc.opts.RaiseFP16 {
				precCompareRaised(t, h, out, 0.9999, 0.01)
			}
		})
	}
}
