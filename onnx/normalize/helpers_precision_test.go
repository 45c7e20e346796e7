package normalize

import (
	"context"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// precModel serializes p and parses it back, as a loaded model would be.
func precModel(t testing.TB, p *onnxpb.ModelProto) *onnx.Model {
	t.Helper()
	data, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Parse(data, "")
	if err != nil {
		t.Fatalf("parsing built model: %v", err)
	}
	return m
}

// precRun runs m in ONNX Runtime (CPU, basic optimizations only, so the
// graph runs as written) on inputs.
func precRun(t testing.TB, m *onnx.Model, inputs map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	ortest.Init(t)
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ort.NewSessionFromBytes(data, ort.SessionOptions{IntraOpThreads: 4, OptLevel: ort.OptBasic})
	if err != nil {
		t.Fatalf("opening session on %s: %v", m.Graph().GetName(), err)
	}
	defer s.Close()
	out, err := s.Run(context.Background(), inputs, nil)
	if err != nil {
		t.Fatalf("running %s: %v", m.Graph().GetName(), err)
	}
	return out
}

// precInputs builds seeded random inputs for m's inputs (dynamic
// dimensions 1), of the given type when as is not Undefined.
func precInputs(t testing.TB, m *onnx.Model, as onnx.DataType, seed uint64) map[string]*onnx.Tensor {
	t.Helper()
	in := map[string]*onnx.Tensor{}
	for _, v := range m.Inputs() {
		dims := v.Shape.Static()
		for i, d := range dims {
			if d < 0 {
				dims[i] = 1
			}
		}
		dt := v.Type
		if as != onnx.Undefined {
			dt = as
		}
		x, err := onnx.Random(v.Name, dt, dims, seed)
		if err != nil {
			t.Fatal(err)
		}
		in[v.Name] = x
	}
	return in
}

// precAsFloat32 converts float16 inputs to float32 (the same values).
func precAsFloat32(t testing.TB, in map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	out := map[string]*onnx.Tensor{}
	for k, v := range in {
		if d, ok := v.Data.([]float16.Float16); ok {
			f := make([]float32, len(d))
			for i, h := range d {
				f[i] = h.Float32()
			}
			v = &onnx.Tensor{Name: v.Name, Type: onnx.Float, Dims: v.Dims, Data: f}
		}
		out[k] = v
	}
	return out
}

// precDiff compares two outputs: the largest absolute difference and the
// cosine similarity.
func precDiff(t testing.TB, want, got *onnx.Tensor) (maxAbs, cosine float64) {
	t.Helper()
	a, err := want.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	b, err := got.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("output %s has %d values, want %d", got.Name, len(b), len(a))
	}
	var dot, na, nb float64
	for i := range a {
		maxAbs = math.Max(maxAbs, math.Abs(a[i]-b[i]))
		dot += a[i] * b[i]
		na += a[i] * a[i]
		nb += b[i] * b[i]
	}
	if na == 0 && nb == 0 {
		return maxAbs, 1
	}
	return maxAbs, dot / math.Sqrt(na*nb)
}

// precConstantsToInits turns Constant nodes with a tensor value into
// initializers, as the constants pass does (kept here so these tests do
// not depend on it).
func precConstantsToInits(m *onnx.Model) int {
	g := m.Graph()
	keep := g.Node[:0]
	n := 0
	for _, node := range g.Node {
		if node.GetOpType() == "Constant" && len(node.Attribute) == 1 && node.Attribute[0].GetName() == "value" {
			t := proto.Clone(node.Attribute[0].GetT()).(*onnxpb.TensorProto)
			t.Name = proto.String(node.Output[0])
			g.Initializer = append(g.Initializer, t)
			n++
			continue
		}
		keep = append(keep, node)
	}
	g.Node = keep
	return n
}

// precFP16 converts m to float16 with convert/fp16.
func precFP16(t testing.TB, m *onnx.Model, keepIO bool) *onnx.Model {
	t.Helper()
	h, _, err := fp16.Convert(m, fp16.Options{KeepIOTypes: keepIO})
	if err != nil {
		t.Fatalf("fp16.Convert: %v", err)
	}
	return precModel(t, h.Proto)
}

// precToHalf returns a float16 (bfloat16 with bf16) initializer holding
// p's float32 values.
func precToHalf(t testing.TB, p *onnxpb.TensorProto, name string, bf16 bool) *onnxpb.TensorProto {
	t.Helper()
	d, err := onnx.Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	f := d.Data.([]float32)
	var x *onnx.Tensor
	if bf16 {
		h := make([]onnx.BF16, len(f))
		for i, v := range f {
			h[i] = onnx.BF16From(v)
		}
		x = &onnx.Tensor{Name: name, Type: onnx.BFloat16, Dims: d.Dims, Data: h}
	} else {
		h := make([]float16.Float16, len(f))
		for i, v := range f {
			h[i] = float16.Fromfloat32(v)
		}
		x = &onnx.Tensor{Name: name, Type: onnx.Float16, Dims: d.Dims, Data: h}
	}
	out, err := onnx.Encode(x, onnx.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// precMixedStorage stores every float32 initializer of p as float16
// (bfloat16 with bf16) and reads it through Cast(to=FLOAT): a
// mixed-precision model that computes in float32.
func precMixedStorage(t testing.TB, p *onnxpb.ModelProto, bf16 bool) *onnx.Model {
	t.Helper()
	p = proto.Clone(p).(*onnxpb.ModelProto)
	g := p.Graph
	var casts []*onnxpb.NodeProto
	for i, init := range g.Initializer {
		if onnx.DataType(init.GetDataType()) != onnx.Float {
			continue
		}
		name := init.GetName()
		g.Initializer[i] = precToHalf(t, init, name+"_fp16", bf16)
		casts = append(casts, &onnxpb.NodeProto{
			OpType: proto.String("Cast"), Name: proto.String("cast_" + name),
			Input: []string{name + "_fp16"}, Output: []string{name},
			Attribute: []*onnxpb.AttributeProto{testmodels.Int("to", int64(onnx.Float))},
		})
	}
	g.Node = append(casts, g.Node...)
	return precModel(t, p)
}

// precMixedCompute is Cast to float16, a float16 Conv and Relu, Cast
// back, then float32 Conv, Relu, Conv: float16 compute between Casts.
func precMixedCompute(t testing.TB) *onnx.Model {
	t.Helper()
	b := testmodels.NewBuilder("mixed_compute", 7)
	x := b.Input("x", onnx.Float, "N", 3, 16, 16)
	h := b.Node("Cast", []string{x}, testmodels.Int("to", int64(onnx.Float16)))
	w := b.He("w1", 27, 8, 3, 3, 3)
	c1 := b.Node("Conv", []string{h, w}, testmodels.Ints("pads", 1, 1, 1, 1))
	r := b.Node("Relu", []string{c1})
	f := b.Node("Cast", []string{r}, testmodels.Int("to", int64(onnx.Float)))
	w2 := b.He("w2", 72, 4, 8, 3, 3)
	c2 := b.Node("Conv", []string{f, w2}, testmodels.Ints("pads", 1, 1, 1, 1))
	r2 := b.Node("Relu", []string{c2})
	w3 := b.He("w3", 36, 4, 4, 3, 3)
	b.Node("Conv", []string{r2, w3}, testmodels.Ints("pads", 1, 1, 1, 1))
	b.Rename("y")
	b.Output("y", onnx.Float, "N", 4, 16, 16)
	p := b.Model(17, 8)
	for i, init := range p.Graph.Initializer {
		if init.GetName() == "w1" {
			p.Graph.Initializer[i] = precToHalf(t, init, "w1", false)
		}
	}
	return precModel(t, p)
}

// precMaxAbs is the largest magnitude in x.
func precMaxAbs(t testing.TB, x *onnx.Tensor) float64 {
	t.Helper()
	v, err := x.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	m := 0.0
	for _, f := range v {
		m = math.Max(m, math.Abs(f))
	}
	return m
}

// precUnranked declares p's graph outputs without a shape (the builder's
// Output with no dimensions declares a scalar).
func precUnranked(p *onnxpb.ModelProto) *onnxpb.ModelProto {
	for _, o := range p.GetGraph().GetOutput() {
		o.GetType().GetTensorType().Shape = nil
	}
	return p
}
