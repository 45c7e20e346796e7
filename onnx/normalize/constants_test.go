package normalize

import (
	"context"
	"reflect"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// TestConstantsPPOCR turns PP-OCR's Constant-node weights into initializers
// and checks that the outputs stay bit-identical on seeded random input.
func TestConstantsPPOCR(t *testing.T) {
	ortest.Init(t)
	for _, tc := range []struct {
		file string
		dims []int64
	}{
		{"ch_PP-OCRv4_det_infer.onnx", []int64{1, 3, 320, 320}},
		{"ch_PP-OCRv4_rec_infer.onnx", []int64{1, 3, 48, 320}},
		{"ch_ppocr_mobile_v2.0_cls_infer.onnx", []int64{1, 3, 48, 192}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			m, err := onnx.Load(testutil.NPMModel(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			before := coreOpCount(m, "Constant")
			out, rep, err := Normalize(context.Background(), m, Options{NoFoldBatchNorm: true})
			if err != nil {
				t.Fatalf("Normalize(%s) = %v", tc.file, err)
			}
			if n := coreOpCount(out, "Constant"); n != 0 {
				t.Errorf("Normalize(%s) left %d of %d Constant nodes", tc.file, n, before)
			}
			var constants Pass
			for _, p := range rep.Passes {
				if p.Name == "constants" {
					constants = p
				}
			}
			if constants.Changed != before {
				t.Errorf("Normalize(%s) constants pass changed %d, want %d", tc.file, constants.Changed, before)
			}
			t.Logf("%s: %d Constant nodes, %d nodes before, %d after; %s", tc.file, before, len(m.Graph().GetNode()), len(out.Graph().GetNode()), rep)
			in := map[string]*onnx.Tensor{"x": coreRandom(t, "x", tc.dims...)}
			want, got := coreMustRun(t, m, in), coreMustRun(t, out, in)
			if d, err := coreDiff(want, got); err != nil || d != 0 {
				t.Errorf("outputs of normalized %s: max difference %g, %v; want bit-identical", tc.file, d, err)
			}
		})
	}
}

// coreConstModel is y = x + c, with c from a Constant node carrying attr.
func coreConstModel(attr *onnxpb.AttributeProto, ir int64) *onnx.Model {
	g := &onnxpb.GraphProto{
		Name:   strRef("constants"),
		Input:  []*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, fixedShape([]int64{2}))},
		Output: []*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, fixedShape([]int64{2}))},
		Node: []*onnxpb.NodeProto{
			coreNode("Constant", "const", nil, []string{"c"}, attr),
			coreNode("Identity", "id", []string{"x"}, []string{"y"}),
		},
	}
	opset := int64(13)
	return &onnx.Model{Proto: &onnxpb.ModelProto{IrVersion: &ir, OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: &opset}}, Graph: g}}
}

func TestConstantsToInitializers(t *testing.T) {
	tensorAttr := testmodels.Tensor("value", []int64{2}, []float32{1, 2})
	for _, tc := range []struct {
		name      string
		attr      *onnxpb.AttributeProto
		ir        int64
		converted int
		want      any // the initializer's data; nil when the node stays
		dims      []int64
	}{
		{"value tensor", tensorAttr, 8, 1, []float32{1, 2}, []int64{2}},
		{"value_float", testmodels.Float("value_float", 2.5), 8, 1, []float32{2.5}, nil},
		{"value_floats", &onnxpb.AttributeProto{Name: strRef("value_floats"), Type: onnxpb.AttributeProto_FLOATS.Enum(), Floats: []float32{1, 2, 3}}, 8, 1, []float32{1, 2, 3}, []int64{3}},
		{"value_int", testmodels.Int("value_int", 7), 8, 1, []int64{7}, nil},
		{"value_ints", testmodels.Ints("value_ints", 4, 5), 8, 1, []int64{4, 5}, []int64{2}},
		{"value_string", &onnxpb.AttributeProto{Name: strRef("value_string"), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte("hi")}, 8, 1, []string{"hi"}, nil},
		{"sparse_value stays", &onnxpb.AttributeProto{Name: strRef("sparse_value"), Type: onnxpb.AttributeProto_SPARSE_TENSOR.Enum(), SparseTensor: &onnxpb.SparseTensorProto{}}, 8, 0, nil, nil},
		{"IR 3 lists it as an input", tensorAttr, 3, 1, []float32{1, 2}, []int64{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := coreConstModel(tc.attr, tc.ir)
			n, err := constantsToInitializers(m)
			if err != nil || n != tc.converted {
				t.Fatalf("constantsToInitializers() = %d, %v, want %d", n, err, tc.converted)
			}
			init := m.Initializer("c")
			if tc.want == nil {
				if init != nil || coreOpCount(m, "Constant") != 1 {
					t.Errorf("constantsToInitializers() converted the node, want it kept")
				}
				return
			}
			if init == nil || coreOpCount(m, "Constant") != 0 {
				t.Fatalf("constantsToInitializers() left no initializer c or kept the node")
			}
			got, err := onnx.Decode(init)
			if err != nil || !reflect.DeepEqual(got.Data, tc.want) || !reflect.DeepEqual(coreDims(got.Dims), coreDims(tc.dims)) {
				t.Errorf("initializer c = %v%v (%v), want %v%v", got.Data, got.Dims, err, tc.want, tc.dims)
			}
			listed := false
			for _, in := range m.Graph().GetInput() {
				listed = listed || in.GetName() == "c"
			}
			if listed != (tc.ir < 4) {
				t.Errorf("initializer c listed as a graph input = %v, want %v (IR %d)", listed, tc.ir < 4, tc.ir)
			}
		})
	}
}

// TestConstantsKeepsGraphOutputs keeps a Constant node that writes a graph
// output.
func TestConstantsKeepsGraphOutputs(t *testing.T) {
	m := coreConstModel(testmodels.Tensor("value", []int64{2}, []float32{1, 2}), 8)
	m.Graph().Output = append(m.Graph().Output, onnx.TensorType("c", onnx.Float, fixedShape([]int64{2})))
	if n, err := constantsToInitializers(m); err != nil || n != 0 || m.Initializer("c") != nil {
		t.Errorf("constantsToInitializers() = %d, %v, want the output's Constant kept", n, err)
	}
}
