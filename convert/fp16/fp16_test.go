package fp16

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

func TestHalf(t *testing.T) {
	l := limits{minPos: defaultMinPositive, maxFinite: defaultMaxFinite}
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		in               float32
		want             float32
		clamped, flushed bool
	}{
		{1, 1, false, false},
		{0, 0, false, false},
		{-0.5, -0.5, false, false},
		{65504, 65504, false, false},
		{65519, 65504, true, false},
		{1e6, 65504, true, false},
		{-1e6, -65504, true, false},
		{1e-9, 5.9604645e-08, false, true},
		{-1e-9, -5.9604645e-08, false, true},
		{1e-7, 1.1920929e-07, false, false}, // a float16 subnormal
		{inf, inf, false, false},
		{-inf, -inf, false, false},
		{0.1, 0.099975586, false, false},
	} {
		h, c, f := l.half(tc.in)
		if got := h.Float32(); got != tc.want || c != tc.clamped || f != tc.flushed {
			t.Errorf("half(%g) = %g, clamped %v, flushed %v; want %g, %v, %v", tc.in, got, c, f, tc.want, tc.clamped, tc.flushed)
		}
	}
	if h, _, _ := l.half(nan); !h.IsNaN() {
		t.Errorf("half(NaN) = %v, want NaN", h)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		ok   bool
	}{
		{Options{}, true},
		{Options{MinPositive: 1e-4, MaxFinite: 1e4}, true},
		{Options{MaxFinite: 1e6}, false},
		{Options{MinPositive: 1e-9}, false},
		{Options{MinPositive: 10, MaxFinite: 1}, false},
	} {
		if err := tc.opts.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v.Validate() = %v, want ok %v", tc.opts, err, tc.ok)
		}
	}
}

// overflowModel is y = x * w with w holding values outside float16's range.
func overflowModel() *onnx.Model {
	b := testmodels.NewBuilder("overflow", 1)
	x := b.Input("x", onnx.Float, 1, 4)
	w := b.Init("w", []int64{1, 4}, []float32{1e6, -1e6, 1e-9, 2})
	b.Node("Mul", []string{x, w})
	b.Rename("y")
	b.Output("y", onnx.Float, 1, 4)
	return &onnx.Model{Proto: b.Model(13, 7)}
}

func TestOverflow(t *testing.T) {
	m := overflowModel()
	h, rep, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []ClampInfo{{Tensor: "w", Clamped: 2, Flushed: 1, Largest: 1e6}}
	if len(rep.Clamped) != 1 || rep.Clamped[0] != want[0] {
		t.Errorf("Convert(overflow).Clamped = %+v, want %+v", rep.Clamped, want)
	}
	wantWarn := `tensor "w": 2 values up to 1e+06 clamped to ±65504, 1 non-zero values below 5.96e-08 raised to ±5.96e-08`
	if !contains(rep.Warnings, wantWarn) {
		t.Errorf("Convert(overflow).Warnings = %q, want %q among them", rep.Warnings, wantWarn)
	}
	w, err := onnx.Decode(h.Initializer("w"))
	if err != nil {
		t.Fatal(err)
	}
	got := w.Data.([]float16.Float16)
	if got[0].Float32() != 65504 || got[1].Float32() != -65504 || got[2].Float32() != 5.9604645e-08 || got[3].Float32() != 2 {
		t.Errorf("converted w = %v, want [65504 -65504 5.96e-08 2]", got)
	}
	initORT(t)
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{1, 4}, Data: []float32{0.5, 0.5, 1, 3}}
	out, err := runModel(h, map[string]*onnx.Tensor{"x": x})
	if err != nil {
		t.Fatal(err)
	}
	y := out["y"].Data.([]float32)
	if y[0] != 32752 || y[1] != -32752 || y[3] != 6 {
		t.Errorf("running the fp16 model: y = %v, want [32752 -32752 5.96e-08 6]", y)
	}
}

func TestKeepIOTypesFalse(t *testing.T) {
	initORT(t)
	m := &onnx.Model{Proto: testmodels.TinyNet(7)}
	h, _, err := Convert(m, Options{KeepIOTypes: false})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(h.Inputs(), h.Outputs()...) {
		if v.Type != onnx.Float16 {
			t.Errorf("Convert(tinynet, KeepIOTypes false): %s, want float16", v)
		}
	}
	x := arangeInput(onnx.ValueInfo{Name: "images", Shape: onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}, {Value: 3, Known: true}, {Value: 32, Known: true}, {Value: 32, Known: true}}}})
	ref, err := runModel(m, map[string]*onnx.Tensor{"images": x})
	if err != nil {
		t.Fatal(err)
	}
	xs := x.Data.([]float32)
	x16 := make([]float16.Float16, len(xs))
	for i, v := range xs {
		x16[i] = float16.Fromfloat32(v)
	}
	got, err := runModel(h, map[string]*onnx.Tensor{"images": {Name: "images", Type: onnx.Float16, Dims: x.Dims, Data: x16}})
	if err != nil {
		t.Fatalf("running the fp16-I/O model: %v", err)
	}
	if got["probs"].Type != onnx.Float16 {
		t.Fatalf("output type %s, want float16", got["probs"].Type)
	}
	st := compareFP16(t, got["probs"], ref["probs"])
	t.Logf("tinynet with float16 I/O: %s", st)
	if st.bad > 0 || st.cosine < fp16MinCosine {
		t.Errorf("tinynet with float16 I/O: %s", st)
	}
}

func TestAlreadyFloat16(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *onnx.Model
	}{
		{"tinynet", &onnx.Model{Proto: testmodels.TinyNet(7)}},
		{"overflow", overflowModel()}, // after KeepIOTypes only Casts show it
	} {
		for _, keep := range []bool{true, false} {
			h, _, err := Convert(tc.m, Options{KeepIOTypes: keep})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = Convert(h, Options{KeepIOTypes: keep})
			if !errors.Is(err, ErrAlreadyFloat16) || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("Convert(Convert(%s), keep %v) = %v, want ErrAlreadyFloat16 naming the model", tc.name, keep, err)
			}
		}
	}
}

func TestInputUntouched(t *testing.T) {
	m := &onnx.Model{Proto: testmodels.TinyNet(7)}
	before, _ := m.Marshal()
	if _, _, err := Convert(m, Options{KeepIOTypes: true}); err != nil {
		t.Fatal(err)
	}
	after, _ := m.Marshal()
	if string(before) != string(after) {
		t.Error("Convert modified its input model")
	}
}

func node(op string, in, out []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{Name: proto.String(op + "_" + out[0]), OpType: proto.String(op), Input: in, Output: out, Attribute: attrs}
}

func graphAttr(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
	ty := onnxpb.AttributeProto_GRAPH
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: &ty, G: g}
}

// ifModel is y = cond ? relu(x)+c : x*w, with c inside the then branch and
// w an outer initializer read by the else branch.
func ifModel() *onnx.Model {
	b := testmodels.NewBuilder("ifmodel", 1)
	b.Input("cond", onnx.Bool)
	b.Input("x", onnx.Float, 2, 3)
	b.Init("w", []int64{3}, []float32{1, 2, 3})
	b.Output("y", onnx.Float, 2, 3)
	mp := b.Model(13, 7)
	c, _ := onnx.Encode(&onnx.Tensor{Name: "c", Type: onnx.Float, Dims: []int64{3}, Data: []float32{0.5, 0.25, 0.125}}, onnx.Raw)
	then := &onnxpb.GraphProto{Name: proto.String("then"), Initializer: []*onnxpb.TensorProto{c},
		Node:   []*onnxpb.NodeProto{node("Relu", []string{"x"}, []string{"r"}), node("Add", []string{"r", "c"}, []string{"t_out"})},
		Output: []*onnxpb.ValueInfoProto{onnx.TensorType("t_out", onnx.Float, onnx.Shape{})}}
	els := &onnxpb.GraphProto{Name: proto.String("else"),
		Node:   []*onnxpb.NodeProto{node("Mul", []string{"x", "w"}, []string{"e_out"})},
		Output: []*onnxpb.ValueInfoProto{onnx.TensorType("e_out", onnx.Float, onnx.Shape{})}}
	mp.Graph.Node = []*onnxpb.NodeProto{node("If", []string{"cond"}, []string{"y"}, graphAttr("then_branch", then), graphAttr("else_branch", els))}
	return &onnx.Model{Proto: mp}
}

func TestSubgraphs(t *testing.T) {
	initORT(t)
	m := ifModel()
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2, 3}, Data: []float32{-1, 0.1, 2, 3, -4, 5.5}}
	for _, tc := range []struct {
		name    string
		opts    Options
		subType onnx.DataType // of the then branch's initializer
	}{
		{"converted", Options{KeepIOTypes: true}, onnx.Float16},
		{"If blocked", Options{KeepIOTypes: true, NodeBlockList: []string{"If_y"}}, onnx.Float},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, rep, err := Convert(m, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			then := h.Graph().GetNode()
			var sub *onnxpb.GraphProto
			for _, n := range then {
				if n.GetOpType() == "If" {
					sub = attr(n, "then_branch").G
				}
			}
			if got := onnx.DataType(sub.GetInitializer()[0].GetDataType()); got != tc.subType {
				t.Errorf("then-branch initializer is %s, want %s (report %+v)", got, tc.subType, rep)
			}
			for _, cond := range []bool{true, false} {
				in := map[string]*onnx.Tensor{"x": x, "cond": {Name: "cond", Type: onnx.Bool, Dims: []int64{}, Data: []bool{cond}}}
				want, err := runModel(m, in)
				if err != nil {
					t.Fatal(err)
				}
				got, err := runModel(h, in)
				if err != nil {
					t.Fatalf("running the fp16 model (cond %v): %v", cond, err)
				}
				if st := compareFP16(t, got["y"], want["y"]); st.bad > 0 {
					t.Errorf("cond %v: %s", cond, st)
				}
			}
		})
	}
}

// blockModel is x → Relu → Cast(to=FLOAT) → TopK(k=2) → Resize(scales 2) → Mul.
func blockModel() *onnx.Model {
	b := testmodels.NewBuilder("blocked", 1)
	b.Input("x", onnx.Float, 1, 1, 2, 4)
	b.Init("k", []int64{1}, []int64{2})
	b.Init("scales", []int64{4}, []float32{1, 1, 2, 2})
	b.Init("m", []int64{1}, []float32{0.5})
	b.Output("y", onnx.Float, 1, 1, 4, 4)
	mp := b.Model(13, 7)
	to := onnxpb.AttributeProto_INT
	mp.Graph.Node = []*onnxpb.NodeProto{
		node("Relu", []string{"x"}, []string{"r"}),
		node("Cast", []string{"r"}, []string{"rc"}, &onnxpb.AttributeProto{Name: proto.String("to"), Type: &to, I: proto.Int64(int64(onnx.Float))}),
		node("TopK", []string{"rc", "k"}, []string{"v", "i"}),
		node("Resize", []string{"v", "", "scales"}, []string{"z"}),
		node("Mul", []string{"z", "m"}, []string{"y"}),
	}
	return &onnx.Model{Proto: mp}
}

func TestBlockListAndCasts(t *testing.T) {
	initORT(t)
	m := blockModel()
	h, rep, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.BlockedNodes, ","); got != "TopK_v" {
		t.Errorf("BlockedNodes = %q, want TopK_v", got)
	}
	types := elemTypes(h.Graph(), nil)
	for _, tc := range []struct {
		what string
		got  onnx.DataType
		want onnx.DataType
	}{
		{"TopK input", types[nodeByOp(h, "TopK").Input[0]], onnx.Float},
		{"TopK values", types[nodeByOp(h, "TopK").Output[0]], onnx.Float},
		{"Resize input", types[nodeByOp(h, "Resize").Input[0]], onnx.Float16},
		{"Resize scales", types[nodeByOp(h, "Resize").Input[2]], onnx.Float},
		{"Mul input m", types[nodeByOp(h, "Mul").Input[1]], onnx.Float16},
	} {
		if tc.got != tc.want {
			t.Errorf("%s is %s, want %s", tc.what, tc.got, tc.want)
		}
	}
	if rep.KeptInitializers != 1 || rep.ConvertedInitializers != 1 {
		t.Errorf("initializers converted %d, kept %d; want 1 (m), 1 (scales)", rep.ConvertedInitializers, rep.KeptInitializers)
	}
	// The original Cast becomes a float16→float16 no-op and the input cast
	// for Relu and the cast back for TopK make a round trip: TopK reads x's
	// Relu output through exactly one Cast.
	if rep.CastsRemoved < 1 {
		t.Errorf("CastsRemoved = %d, want >= 1", rep.CastsRemoved)
	}
	for _, n := range h.Graph().GetNode() {
		if isCast(n) {
			in := types[n.GetInput()[0]]
			if p := producerOf(h, n.GetInput()[0]); (p != nil && isCast(p)) || in == onnx.DataType(attrInt(n, "to", 0)) {
				t.Errorf("redundant Cast %s left (%s → %s)", nodeLabel(n), in, onnx.DataType(attrInt(n, "to", 0)))
			}
		}
	}
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{1, 1, 2, 4}, Data: []float32{1, -2, 3.3, 4, 0.5, 6, -7, 8.25}}
	want, err := runModel(m, map[string]*onnx.Tensor{"x": x})
	if err != nil {
		t.Fatal(err)
	}
	got, err := runModel(h, map[string]*onnx.Tensor{"x": x})
	if err != nil {
		t.Fatalf("running the fp16 model: %v", err)
	}
	if st := compareFP16(t, got["y"], want["y"]); st.bad > 0 {
		t.Errorf("blocked model: %s", st)
	}
}

func nodeByOp(m *onnx.Model, op string) *onnxpb.NodeProto {
	for _, n := range m.Graph().GetNode() {
		if n.GetOpType() == op {
			return n
		}
	}
	return &onnxpb.NodeProto{Input: []string{"", "", ""}, Output: []string{""}}
}

func producerOf(m *onnx.Model, name string) *onnxpb.NodeProto {
	return onnx.NewIndex(m.Graph()).Producer[name]
}

func TestRefusals(t *testing.T) {
	custom := func(block bool, typed bool) *onnx.Model {
		b := testmodels.NewBuilder("custom", 1)
		x := b.Input("x", onnx.Float, 4)
		b.Output("y", onnx.Float, 4)
		mp := b.Model(13, 7)
		n := node("FastGelu", []string{x}, []string{"g"})
		n.Domain = proto.String("com.microsoft")
		mp.Graph.Node = []*onnxpb.NodeProto{n, node("Relu", []string{"g"}, []string{"y"})}
		if typed {
			mp.Graph.ValueInfo = append(mp.Graph.ValueInfo, onnx.TensorType("g", onnx.Float, onnx.Shape{}))
		}
		mp.OpsetImport = append(mp.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: proto.String("com.microsoft"), Version: proto.Int64(1)})
		return &onnx.Model{Proto: mp}
	}
	old := overflowModel()
	old.SetOpset("", 5)
	seq := overflowModel()
	seq.Graph().Node = append(seq.Graph().Node, node("SequenceConstruct", []string{"y"}, []string{"s"}))
	for _, tc := range []struct {
		name string
		m    *onnx.Model
		opts Options
		want string // "" means success
	}{
		{"custom domain", custom(false, true), Options{}, `node FastGelu_g (FastGelu): operator from a domain whose types the rewrite does not know: domain "com.microsoft"`},
		{"custom domain blocked", custom(true, true), Options{OpBlockList: []string{"FastGelu"}}, ""},
		{"custom domain blocked untyped", custom(true, false), Options{OpBlockList: []string{"FastGelu"}}, `cannot tell the element type of output "g"`},
		{"opset 5", old, Options{}, "opset 5 is not supported"},
		{"sequence", seq, Options{}, "SequenceConstruct works on sequences"},
		{"bad options", overflowModel(), Options{MaxFinite: 1e5}, "invalid fp16 options"},
	} {
		_, _, err := Convert(tc.m, tc.opts)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Convert(%s) = %v, want success", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Convert(%s) = %v, want error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestTypeAttributes(t *testing.T) {
	b := testmodels.NewBuilder("attrs", 1)
	b.Input("x", onnx.Float, 2)
	b.Output("y", onnx.Float, 2)
	mp := b.Model(13, 7)
	shape, _ := onnx.Encode(&onnx.Tensor{Type: onnx.Int64, Dims: []int64{1}, Data: []int64{2}}, onnx.Raw)
	ty := onnxpb.AttributeProto_TENSOR
	mp.Graph.Node = []*onnxpb.NodeProto{
		node("Constant", nil, []string{"shape"}, &onnxpb.AttributeProto{Name: proto.String("value"), Type: &ty, T: shape}),
		node("ConstantOfShape", []string{"shape"}, []string{"zeros"}),
		node("RandomNormal", nil, []string{"noise"}, testmodels.Ints("shape", 2), testmodels.Float("scale", 1e-6)),
		node("Add", []string{"x", "zeros"}, []string{"a"}),
		node("Add", []string{"a", "noise"}, []string{"y"}),
	}
	m := &onnx.Model{Proto: mp}
	// An empty block list converts RandomNormal (the default list keeps
	// it float32 for ONNX Runtime's CPU provider).
	h, _, err := Convert(m, Options{KeepIOTypes: true, OpBlockList: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := attrInt(nodeByOp(h, "RandomNormal"), "dtype", 0); got != int64(onnx.Float16) {
		t.Errorf("RandomNormal dtype = %d, want %d", got, onnx.Float16)
	}
	if got := attr(nodeByOp(h, "ConstantOfShape"), "value").GetT().GetDataType(); got != int32(onnx.Float16) {
		t.Errorf("ConstantOfShape value type = %d, want %d", got, onnx.Float16)
	}
	// ONNX Runtime's CPU provider has no float16 RandomNormal kernel (and,
	// with no float16 input, cannot cast around it), so the default block
	// list keeps it float32.
	initORT(t)
	h, rep, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.BlockedNodes, ","); got != "RandomNormal_noise" {
		t.Errorf("BlockedNodes = %q, want RandomNormal_noise", got)
	}
	x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2}, Data: []float32{1.5, -2}}
	got, err := runModel(h, map[string]*onnx.Tensor{"x": x})
	if err != nil {
		t.Fatalf("running the fp16 model: %v", err)
	}
	if y := got["y"].Data.([]float32); math.Abs(float64(y[0])-1.5) > 1e-3 || math.Abs(float64(y[1])+2) > 1e-3 {
		t.Errorf("y = %v, want [1.5 -2] ± 1e-3", y)
	}
}
