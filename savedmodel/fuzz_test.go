package savedmodel

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// FuzzBundleIndex feeds arbitrary bytes to the variables.index reader:
// it never panics or allocates past its input, and what it accepts
// round-trips: writing the entries it read as a table and reading that
// again gives the same bundle.
func FuzzBundleIndex(f *testing.F) {
	idx, _ := filepath.Glob(testutil.CorpusPath(f, "savedmodel", "*", "*", "*", "variables", "variables.index"))
	more, _ := filepath.Glob(testutil.CorpusPath(f, "savedmodel", "*", "*", "variables", "variables.index"))
	for _, p := range append(idx, more...) {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add(writeTable(f, []kv{{nil, mustMarshal(f, &smpb.BundleHeaderProto{NumShards: 1})}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		kvs, err := readTable(data)
		if err != nil {
			return
		}
		again, err := readTable(writeTable(t, kvs))
		if err != nil || !reflect.DeepEqual(normalize(again), normalize(kvs)) {
			t.Fatalf("entries do not round-trip: %v", err)
		}
		b, err := parseIndex(data)
		if err != nil {
			return
		}
		if !slices.IsSorted(b.keys) || len(b.keys) != len(kvs)-1 {
			t.Fatalf("parseIndex kept %d keys of %d entries", len(b.keys), len(kvs))
		}
	})
}

// normalize makes empty keys and values compare equal however they were
// allocated.
func normalize(kvs []kv) []kv {
	out := make([]kv, len(kvs))
	for i, e := range kvs {
		out[i] = kv{append([]byte{}, e.key...), append([]byte{}, e.value...)}
	}
	return out
}

// FuzzTensorProto decodes arbitrary TensorProtos: no panic, the element
// count always matches the shape, and a numeric tensor re-encoded as
// tensor_content decodes to the same values; InitializerFromProto fails
// when TensorFromProto does and otherwise gives what encoding its tensor
// does.
func FuzzTensorProto(f *testing.F) {
	for _, p := range []*smpb.TensorProto{
		{Dtype: smpb.DataType_DT_FLOAT, TensorShape: shapeProto([]int64{2}), FloatVal: []float32{1}},
		{Dtype: smpb.DataType_DT_HALF, TensorShape: shapeProto([]int64{1, 2}), HalfVal: []int32{0x3c00, 7}},
		{Dtype: smpb.DataType_DT_COMPLEX128, DcomplexVal: []float64{1, 2, 3}},
		{Dtype: smpb.DataType_DT_STRING, TensorShape: shapeProto([]int64{2}), StringVal: [][]byte{[]byte("x")}},
		{Dtype: smpb.DataType_DT_INT32, TensorShape: shapeProto([]int64{2}), TensorContent: []byte{1, 0, 0, 0, 2, 0, 0, 0}},
	} {
		f.Add(mustMarshal(f, p))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &smpb.TensorProto{}
		if proto.Unmarshal(data, p) != nil {
			return
		}
		// Broadcasting a value to a huge shape is legitimate but costs its
		// size in memory; the fuzzer need not prove that.
		if dims, unknown := Shape(p.GetTensorShape()); !unknown {
			if n, err := onnx.NumElements(dims); err != nil || n > 1<<16 {
				return
			}
		}
		got, err := TensorFromProto(p)
		init, ierr := InitializerFromProto(p, "c")
		if (err == nil) != (ierr == nil) {
			t.Fatalf("TensorFromProto: %v, InitializerFromProto: %v", err, ierr)
		}
		if err != nil {
			return
		}
		if want, err := onnx.Encode(&onnx.Tensor{Name: "c", Type: got.Type, Dims: got.Dims, Data: got.Data}, onnx.Raw); err != nil || !sameBytes(init, want) {
			t.Fatalf("InitializerFromProto = %v, want what Encode writes: %v (%v)", init, want, err)
		}
		n, _ := onnx.NumElements(got.Dims)
		if got.Len() != n {
			t.Fatalf("%d elements for shape %v", got.Len(), got.Dims)
		}
		if got.Type == onnx.String {
			return
		}
		q := &smpb.TensorProto{Dtype: p.GetDtype(), TensorShape: p.GetTensorShape(), TensorContent: onnx.RawBytes(got)}
		if n == 0 {
			return // empty tensor_content means "use the typed fields"
		}
		again, err := TensorFromProto(q)
		if err != nil || !bytes.Equal(onnx.RawBytes(again), onnx.RawBytes(got)) {
			t.Fatalf("tensor_content round trip: %v", err)
		}
	})
}

// FuzzDotDimensionNumbers feeds arbitrary bytes to XlaDot's
// dimension_numbers reader: it never panics, and what it accepts
// round-trips through the packed encoding jax2tf writes.
func FuzzDotDimensionNumbers(f *testing.F) {
	f.Add([]byte("\n\x01\x02\x12\x01\x01"))
	f.Add([]byte("\n\x01\x02\x12\x01\x01\x1a\x01\x00\"\x01\x00"))
	f.Add([]byte("\x08\x02\x10\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := parseDotDims(b)
		if err != nil {
			return
		}
		var enc []byte
		for i, v := range [][]int64{d.lhsContract, d.rhsContract, d.lhsBatch, d.rhsBatch} {
			var p []byte
			for _, x := range v {
				p = protowire.AppendVarint(p, uint64(x))
			}
			enc = protowire.AppendTag(enc, protowire.Number(i+1), protowire.BytesType)
			enc = protowire.AppendBytes(enc, p)
		}
		again, err := parseDotDims(enc)
		if err != nil || !reflect.DeepEqual(normDims(again), normDims(d)) {
			t.Fatalf("re-encoded %+v parsed as %+v (%v)", d, again, err)
		}
		if r := len(d.lhsContract) + len(d.lhsBatch); r < 20 {
			_, _ = d.equation(r+1, r+1)
		}
	})
}

func normDims(d dotDims) [4][]int64 {
	out := [4][]int64{d.lhsContract, d.rhsContract, d.lhsBatch, d.rhsBatch}
	for i := range out {
		if len(out[i]) == 0 {
			out[i] = nil
		}
	}
	return out
}
