package kserve

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// compareRequests checks that got carries what want does.
func compareRequests(t *testing.T, want, got *Request) {
	t.Helper()
	if got.ID != want.ID || got.BinaryOutput != want.BinaryOutput {
		t.Fatalf("id, binary_data_output = %q, %v, want %q, %v", got.ID, got.BinaryOutput, want.ID, want.BinaryOutput)
	}
	if len(got.Inputs) != len(want.Inputs) {
		t.Fatalf("%d inputs, want %d", len(got.Inputs), len(want.Inputs))
	}
	for i := range want.Inputs {
		if err := sameTensor(want.Inputs[i], got.Inputs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(got.Outputs, want.Outputs) {
		t.Fatalf("outputs = %#v, want %#v", got.Outputs, want.Outputs)
	}
	if !reflect.DeepEqual(got.Parameters, want.Parameters) && (len(got.Parameters) > 0 || len(want.Parameters) > 0) {
		t.Fatalf("parameters = %#v, want %#v", got.Parameters, want.Parameters)
	}
}

// jsonCannotHold reports whether a tensor has values JSON has no form for.
func jsonCannotHold(ts []*onnx.Tensor) bool {
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }
	for _, t := range ts {
		switch d := t.Data.(type) {
		case []float32:
			for _, v := range d {
				if bad(float64(v)) {
					return true
				}
			}
		case []float64:
			for _, v := range d {
				if bad(v) {
					return true
				}
			}
		case []float16.Float16:
			for _, v := range d {
				if bad(float64(v.Float32())) {
					return true
				}
			}
		case []onnx.BF16:
			for _, v := range d {
				if bad(float64(v.Float32())) {
					return true
				}
			}
		case []string:
			for _, v := range d {
				if !utf8.ValidString(v) {
					return true
				}
			}
		}
	}
	return false
}

// fuzzSeeds are request bodies with their header lengths: the corpus's
// requests and hand-made binary ones, whole and cut short.
func fuzzSeeds(t testing.TB) [][2]any {
	var seeds [][2]any
	dir := testutil.CorpusPath(t, "kserve-v2")
	files, _ := filepath.Glob(filepath.Join(dir, "spec-examples", "*request*.http"))
	for _, f := range files {
		if ex, err := readExample(f); err == nil {
			seeds = append(seeds, [2]any{ex.body, -1})
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "gke_marketplace_bert_request.json")); err == nil {
		seeds = append(seeds, [2]any{b, -1})
	}
	reqs := []*Request{
		{ID: "all", Inputs: allTypes(), Outputs: []OutputRequest{{Name: "o", Binary: true}}},
		{Inputs: []*onnx.Tensor{{Name: "nan", Type: onnx.Float, Dims: []int64{2}, Data: []float32{float32(math.NaN()), float32(math.Inf(1))}}}},
		{Inputs: []*onnx.Tensor{{Name: "s", Type: onnx.String, Dims: []int64{2, 1}, Data: []string{"\xff\xfe", ""}}}, BinaryOutput: true},
	}
	for _, r := range reqs {
		for _, binary := range []bool{true, false} {
			body, n, err := EncodeRequest(r, binary)
			if err != nil {
				continue
			}
			if n == len(body) {
				n = -1
			}
			seeds = append(seeds, [2]any{body, n})
			if n > 0 {
				seeds = append(seeds, [2]any{body[:len(body)-3], n}, [2]any{body, n - 1})
			}
		}
	}
	return seeds
}

// FuzzDecodeRequest decodes arbitrary bodies; whatever decodes must
// re-encode, as binary and (values permitting) as JSON, and decode again to
// the same tensors, outputs, id and parameters.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s[0].([]byte), s[1].(int))
	}
	f.Fuzz(func(t *testing.T, body []byte, headerLen int) {
		req, err := DecodeRequest(body, headerLen)
		if err != nil {
			return
		}
		for _, binary := range []bool{true, false} {
			again, n, err := EncodeRequest(req, binary)
			if err != nil {
				if binary || !jsonCannotHold(req.Inputs) {
					t.Fatalf("EncodeRequest(binary=%v) of a decoded request: %v", binary, err)
				}
				continue
			}
			got, err := DecodeRequest(again, n)
			if err != nil {
				t.Fatalf("DecodeRequest(EncodeRequest(binary=%v)): %v\n%q", binary, err, again)
			}
			compareRequests(t, req, got)
		}
	})
}
