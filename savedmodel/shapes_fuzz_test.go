package savedmodel

import (
	"strconv"
	"testing"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// fuzzOps are ops with shape rules, for FuzzInferShapes.
var fuzzOps = []string{"Placeholder", "Const", "Relu", "AddV2", "Select", "IdentityN", "MatMul", "BatchMatMulV2",
	"Reshape", "Transpose", "ExpandDims", "Squeeze", "ConcatV2", "Pack", "Shape", "Mean", "ArgMax", "Fill",
	"Tile", "Conv2D", "DepthwiseConv2dNative", "MaxPool", "Einsum"}

// fuzzGraph builds a graph from bytes: each node takes an op, up to three
// earlier outputs as inputs, and attributes (shapes, integer lists,
// constant values, _output_shapes) from the bytes that follow.
func fuzzGraph(data []byte) []*tfNode {
	next := func() int64 {
		if len(data) == 0 {
			return 0
		}
		v := int64(int8(data[0]))
		data = data[1:]
		return v
	}
	dims := func() *smpb.TensorShapeProto {
		n := next()
		if n < 0 {
			return &smpb.TensorShapeProto{UnknownRank: true}
		}
		p := &smpb.TensorShapeProto{}
		for range n % 6 {
			p.Dim = append(p.Dim, &smpb.TensorShapeProto_Dim{Size: next() * next()})
		}
		return p
	}
	var nodes []*tfNode
	for len(data) > 0 && len(nodes) < 32 {
		n := &tfNode{name: "n" + strconv.Itoa(len(nodes)), op: fuzzOps[uint64(next())%uint64(len(fuzzOps))], attr: map[string]*smpb.AttrValue{}}
		for range next() % 4 {
			if len(nodes) > 0 {
				n.inputs = append(n.inputs, nodes[uint64(next())%uint64(len(nodes))].name+":"+strconv.Itoa(int(next()%3)))
			}
		}
		ints := []int64{next(), next(), next(), next()}[:uint64(next())%5]
		n.attr["shape"] = &smpb.AttrValue{Value: &smpb.AttrValue_Shape{Shape: dims()}}
		for _, k := range []string{"strides", "ksize", "dilations", "squeeze_dims"} {
			n.attr[k] = &smpb.AttrValue{Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{I: ints}}}
		}
		n.attr["axis"] = &smpb.AttrValue{Value: &smpb.AttrValue_I{I: next()}}
		n.attr["padding"] = &smpb.AttrValue{Value: &smpb.AttrValue_S{S: []byte([]string{"SAME", "VALID", ""}[uint64(next())%3])}}
		n.attr["_output_shapes"] = &smpb.AttrValue{Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{Shape: []*smpb.TensorShapeProto{dims(), dims()}}}}
		vals := make([]int32, len(ints))
		for i, v := range ints {
			vals[i] = int32(v * next())
		}
		n.attr["value"] = &smpb.AttrValue{Value: &smpb.AttrValue_Tensor{Tensor: &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32,
			TensorShape: &smpb.TensorShapeProto{Dim: []*smpb.TensorShapeProto_Dim{{Size: int64(len(vals))}}}, IntVal: vals}}}
		nodes = append(nodes, n)
	}
	return nodes
}

// FuzzInferShapes: shape inference on any graph ends without a panic and
// gives every tensor a shape within bounds.
func FuzzInferShapes(f *testing.F) {
	f.Add([]byte{0, 0, 3, 2, 1, 5, 1, 2, 3, 4, 2, 8, 1, 0, 7, 1, 0, 1, 0, 2, 2})
	f.Add([]byte{1, 2, 4, 1, 2, 3, 4, 1, 4, 2, 2, 2, 1, 0, 0, 0, 9, 2, 0, 0, 0, 1, 0, 1, 19, 2, 0, 0, 0, 1, 4, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		si := inferShapes(fuzzGraph(data), nil, nil)
		for ref, s := range si.shapes {
			if len(s.dims) > 2*maxRank || (!s.ranked && s.dims != nil) {
				t.Fatalf("%s: shape %v (ranked %v)", ref, s.dims, s.ranked)
			}
		}
	})
}
