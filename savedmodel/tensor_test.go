package savedmodel

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/x448/float16"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

func TestTensorFromProto(t *testing.T) {
	shape := shapeProto
	f16 := func(f float32) int32 { return int32(float16.Fromfloat32(f).Bits()) }
	raw := make([]byte, 8)
	for i, f := range []float32{1.5, -2} {
		b := math.Float32bits(f)
		raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	cases := []struct {
		name string
		p    *smpb.TensorProto
		dt   onnx.DataType
		dims []int64
		data any
	}{
		{"tensor_content", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shape([]int64{2}), TensorContent: raw},
			onnx.Float, []int64{2}, []float32{1.5, -2}},
		{"scalar", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, FloatVal: []float32{7}}, onnx.Float, nil, []float32{7}},
		{"broadcast", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shape([]int64{2, 2}), FloatVal: []float32{3}},
			onnx.Float, []int64{2, 2}, []float32{3, 3, 3, 3}},
		{"last repeated", &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32, TensorShape: shape([]int64{4}), IntVal: []int32{1, 2}},
			onnx.Int32, []int64{4}, []int32{1, 2, 2, 2}},
		{"empty is zeros", &smpb.TensorProto{Dtype: smpb.DataType_DT_INT64, TensorShape: shape([]int64{3})},
			onnx.Int64, []int64{3}, []int64{0, 0, 0}},
		{"half_val", &smpb.TensorProto{Dtype: smpb.DataType_DT_HALF, TensorShape: shape([]int64{2}), HalfVal: []int32{f16(1), f16(-0.5)}},
			onnx.Float16, []int64{2}, []float16.Float16{float16.Fromfloat32(1), float16.Fromfloat32(-0.5)}},
		{"bfloat16", &smpb.TensorProto{Dtype: smpb.DataType_DT_BFLOAT16, HalfVal: []int32{0x3f80}}, onnx.BFloat16, nil, []onnx.BF16{0x3f80}},
		{"int8 from int_val", &smpb.TensorProto{Dtype: smpb.DataType_DT_INT8, TensorShape: shape([]int64{2}), IntVal: []int32{-3, 4}},
			onnx.Int8, []int64{2}, []int8{-3, 4}},
		{"quint8", &smpb.TensorProto{Dtype: smpb.DataType_DT_QUINT8, IntVal: []int32{200}}, onnx.Uint8, nil, []uint8{200}},
		{"bool", &smpb.TensorProto{Dtype: smpb.DataType_DT_BOOL, TensorShape: shape([]int64{2}), BoolVal: []bool{true, false}},
			onnx.Bool, []int64{2}, []bool{true, false}},
		{"uint32", &smpb.TensorProto{Dtype: smpb.DataType_DT_UINT32, Uint32Val: []uint32{1 << 31}}, onnx.Uint32, nil, []uint32{1 << 31}},
		{"string", &smpb.TensorProto{Dtype: smpb.DataType_DT_STRING, TensorShape: shape([]int64{2}), StringVal: [][]byte{[]byte("a"), []byte("bc")}},
			onnx.String, []int64{2}, []string{"a", "bc"}},
		{"complex64 pairs", &smpb.TensorProto{Dtype: smpb.DataType_DT_COMPLEX64, TensorShape: shape([]int64{2}), ScomplexVal: []float32{1, 2}},
			onnx.Complex64, []int64{2}, []complex64{1 + 2i, 1 + 2i}},
		{"ref type", &smpb.TensorProto{Dtype: smpb.DataType_DT_DOUBLE_REF, DoubleVal: []float64{1}}, onnx.Double, nil, []float64{1}},
		{"zero elements", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shape([]int64{0, 3})}, onnx.Float, []int64{0, 3}, []float32{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := TensorFromProto(c.p)
			if err != nil {
				t.Fatal(err)
			}
			if got.Type != c.dt || !slices.Equal(got.Dims, c.dims) || !reflect.DeepEqual(got.Data, c.data) {
				t.Errorf("TensorFromProto = %s%v %v, want %s%v %v", got.Type, got.Dims, got.Data, c.dt, c.dims, c.data)
			}
		})
	}
}

func TestTensorFromProtoErrors(t *testing.T) {
	cases := []struct {
		name string
		p    *smpb.TensorProto
		want string
	}{
		{"resource", &smpb.TensorProto{Dtype: smpb.DataType_DT_RESOURCE}, "DT_RESOURCE"},
		{"invalid", &smpb.TensorProto{}, "DT_INVALID"},
		{"unknown dim", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto([]int64{-1})}, "negative"},
		{"unknown rank", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: &smpb.TensorShapeProto{UnknownRank: true}}, "unknown rank"},
		{"short content", &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto([]int64{2}), TensorContent: []byte{1, 2, 3}}, "3 bytes"},
	}
	for _, c := range cases {
		if _, err := TensorFromProto(c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: TensorFromProto = %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// constValues returns the value attr of every Const node in a meta graph,
// in the graph and in its functions, by node name.
func constValues(mg *smpb.MetaGraphDef) map[string]*smpb.TensorProto {
	out := map[string]*smpb.TensorProto{}
	add := func(prefix string, nodes []*smpb.NodeDef) {
		for _, n := range nodes {
			if n.GetOp() == "Const" {
				out[prefix+n.GetName()] = n.GetAttr()["value"].GetTensor()
			}
		}
	}
	add("", mg.GetGraphDef().GetNode())
	for _, f := range mg.GetGraphDef().GetLibrary().GetFunction() {
		add(f.GetSignature().GetName()+"/", f.GetNodeDef())
	}
	return out
}

// Every Const in every corpus SavedModel decodes, to the dtype its node
// declares.
func TestCorpusConsts(t *testing.T) {
	total := 0
	for rel := range corpusModels {
		m, _ := openModel(t, strings.Split(rel, "/")...)
		mg, err := m.MetaGraph("")
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range constValues(mg) {
			total++
			got, err := TensorFromProto(p)
			if err != nil {
				t.Errorf("%s: Const %s: %v", rel, name, err)
				continue
			}
			if n, _ := onnx.NumElements(got.Dims); got.Len() != n {
				t.Errorf("%s: Const %s has %d elements for shape %v", rel, name, got.Len(), got.Dims)
			}
		}
	}
	if total < 500 {
		t.Errorf("decoded %d Const values, want the corpus's hundreds", total)
	}
}
