package ort_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"github.com/x448/float16"
)

// identityModel builds y = Identity(x) (or another one-input op) with the
// given element type and shape of x and y.
func identityModel(t testing.TB, op string, in, out onnx.DataType, shape onnx.Shape, attrs ...*onnxpb.AttributeProto) []byte {
	t.Helper()
	ir, opset, domain := int64(10), int64(21), ""
	node := &onnxpb.NodeProto{OpType: &op, Input: []string{"x"}, Output: []string{"y"}, Attribute: attrs}
	name := "g"
	m := &onnx.Model{Proto: &onnxpb.ModelProto{
		IrVersion:   &ir,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: &domain, Version: &opset}},
		Graph: &onnxpb.GraphProto{
			Name:   &name,
			Node:   []*onnxpb.NodeProto{node},
			Input:  []*onnxpb.ValueInfoProto{onnx.TensorType("x", in, shape)},
			Output: []*onnxpb.ValueInfoProto{onnx.TensorType("y", out, shape)},
		},
	}}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func castTo(dt onnx.DataType) *onnxpb.AttributeProto {
	n, typ, v := "to", onnxpb.AttributeProto_INT, int64(dt)
	return &onnxpb.AttributeProto{Name: &n, Type: &typ, I: &v}
}

var (
	static2x3 = onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}, {Value: 3, Known: true}}}
	dynNx3    = onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Param: "N"}, {Value: 3, Known: true}}}
	scalar    = onnx.Shape{Ranked: true}
)

// sample returns six values of the Go type that stores dt.
func sample(dt onnx.DataType) any {
	switch dt {
	case onnx.Float:
		return []float32{1.5, -2, 0, 3.25, 1e-8, -7}
	case onnx.Double:
		return []float64{1.5, -2, 0, 3.25, 1e-300, -7}
	case onnx.Float16:
		return f16s(1.5, -2, 0, 3.25, 65504, -7)
	case onnx.BFloat16:
		return []onnx.BF16{onnx.BF16From(1.5), onnx.BF16From(-2), 0, onnx.BF16From(3e38), 1, 0x7fc1}
	case onnx.Int8:
		return []int8{-128, 127, 0, 1, -1, 5}
	case onnx.Int16:
		return []int16{-32768, 32767, 0, 1, -1, 5}
	case onnx.Int32:
		return []int32{-1 << 31, 1<<31 - 1, 0, 1, -1, 5}
	case onnx.Int64:
		return []int64{-1 << 63, 1<<63 - 1, 0, 1, -1, 5}
	case onnx.Uint8:
		return []uint8{0, 255, 1, 2, 3, 4}
	case onnx.Uint16:
		return []uint16{0, 65535, 1, 2, 3, 4}
	case onnx.Uint32:
		return []uint32{0, 1<<32 - 1, 1, 2, 3, 4}
	case onnx.Uint64:
		return []uint64{0, 1<<64 - 1, 1, 2, 3, 4}
	case onnx.Bool:
		return []bool{true, false, true, true, false, false}
	case onnx.String:
		return []string{"a", "", "kiln", "ü", "x y", "6"}
	}
	return nil
}

// first returns a one-element slice of the same type as sample(dt).
func first(dt onnx.DataType) any {
	v := reflect.ValueOf(sample(dt))
	return v.Slice(0, 1).Interface()
}

// TestElementTypes passes every supported element type through Identity
// with a static shape, a dynamic dimension and rank 0.
func TestElementTypes(t *testing.T) {
	ortest.Init(t)
	types := []onnx.DataType{onnx.Float, onnx.Double, onnx.Float16, onnx.BFloat16, onnx.Int8, onnx.Int16,
		onnx.Int32, onnx.Int64, onnx.Uint8, onnx.Uint16, onnx.Uint32, onnx.Uint64, onnx.Bool, onnx.String}
	for _, dt := range types {
		for _, sh := range []struct {
			name  string
			shape onnx.Shape
			dims  []int64
		}{{"static", static2x3, []int64{2, 3}}, {"dynamic", dynNx3, []int64{2, 3}}, {"scalar", scalar, []int64{}}} {
			t.Run(dt.String()+"/"+sh.name, func(t *testing.T) {
				s, err := ort.NewSessionFromBytes(identityModel(t, "Identity", dt, dt, sh.shape), ort.SessionOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				data := sample(dt)
				if len(sh.dims) == 0 {
					data = first(dt)
				}
				x := &onnx.Tensor{Name: "x", Type: dt, Dims: sh.dims, Data: data}
				got, err := s.Run(context.Background(), map[string]*onnx.Tensor{"x": x}, nil)
				halfOrString := dt == onnx.Float16 || dt == onnx.BFloat16 || dt == onnx.String
				if len(sh.dims) == 0 && halfOrString {
					// The binding builds rank-0 tensors only for its numeric types.
					if !errors.Is(err, ort.ErrScalarCustom) || !strings.Contains(err.Error(), `input "x"`) {
						t.Fatalf("Run(rank-0 %s) = %v, want error naming input x", dt, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				y := got["y"]
				if y == nil || !reflect.DeepEqual(y.Dims, sh.dims) || !sameBits(y, x) {
					t.Fatalf("Run = %+v, want %+v", y, x)
				}
			})
		}
	}
}

// TestHalfOutputs checks the work-around for float16/bfloat16 outputs that
// ONNX Runtime allocates: static shapes are pre-allocated, dynamic and
// rank-0 ones go through a float32 cast.
func TestHalfOutputs(t *testing.T) {
	ortest.Init(t)
	in := []float32{1, -2.5, 65504, 1e-7, 3.14159, -0.0}
	for _, dt := range []onnx.DataType{onnx.Float16, onnx.BFloat16} {
		for _, sh := range []struct {
			name  string
			shape onnx.Shape
			dims  []int64
		}{{"static", static2x3, []int64{2, 3}}, {"dynamic", dynNx3, []int64{2, 3}}, {"scalar", scalar, []int64{}}} {
			t.Run(dt.String()+"/"+sh.name, func(t *testing.T) {
				s, err := ort.NewSessionFromBytes(identityModel(t, "Cast", onnx.Float, dt, sh.shape, castTo(dt)), ort.SessionOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if got := s.Outputs(); len(got) != 1 || got[0].Name != "y" || got[0].Type != dt {
					t.Fatalf("Outputs() = %+v, want only y of type %s", got, dt)
				}
				data := in
				if len(sh.dims) == 0 {
					data = in[:1]
				}
				x := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: sh.dims, Data: data}
				got, err := s.Run(context.Background(), map[string]*onnx.Tensor{"x": x}, []string{"y"})
				if err != nil {
					t.Fatal(err)
				}
				y := got["y"]
				if y.Type != dt || !reflect.DeepEqual(y.Dims, sh.dims) || len(got) != 1 {
					t.Fatalf("Run = %v, want y of type %s and shape %v", got, dt, sh.dims)
				}
				for i, v := range data {
					var g, w uint16
					switch dt {
					case onnx.Float16:
						g, w = y.Data.([]float16.Float16)[i].Bits(), float16.Fromfloat32(v).Bits()
					default:
						// ONNX Runtime's Cast to bfloat16 rounds to nearest even.
						g, w = uint16(y.Data.([]onnx.BF16)[i]), uint16(onnx.BF16From(v))
					}
					if g != w {
						t.Errorf("y[%d] = %#04x, want %#04x (cast of %v)", i, g, w, v)
					}
				}
			})
		}
	}
}

// TestCastFloat16Dynamic runs the corpus test_cast_FLOAT_to_FLOAT16 with its
// batch dimension made dynamic, so its float16 output cannot be pre-allocated.
func TestCastFloat16Dynamic(t *testing.T) {
	ortest.Init(t)
	dir := testutil.Corpus(t, "onnx-node", "test_cast_FLOAT_to_FLOAT16")
	m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	in, want := testData(t, m, dir)
	g := m.Graph()
	for _, v := range append(g.GetInput(), g.GetOutput()...) {
		d := v.GetType().GetTensorType().GetShape().GetDim()[0]
		d.Value = &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	optimized := filepath.Join(t.TempDir(), "optimized.onnx")
	s, err := ort.NewSessionFromBytes(data, ort.SessionOptions{OptLevel: ort.OptBasic, OptimizedModelPath: optimized})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := s.Outputs()
	if len(out) != 1 || out[0].Dims[0] != -1 || out[0].Params[0] != "batch" {
		t.Fatalf("Outputs() = %+v, want one output with dynamic dimension batch", out)
	}
	runMatches(t, s, in, want)
	// The optimized model is written from the model as given, without the
	// helper float32 output.
	om, err := onnx.Load(optimized)
	if err != nil {
		t.Fatal(err)
	}
	if names := om.Outputs(); len(names) != 1 || names[0].Name != out[0].Name {
		t.Errorf("optimized model outputs = %v, want only %s", names, out[0].Name)
	}
}

func TestRunErrors(t *testing.T) {
	ortest.Init(t)
	s, err := ort.NewSessionFromBytes(identityModel(t, "Identity", onnx.Float, onnx.Float, dynNx3), ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ok := &onnx.Tensor{Type: onnx.Float, Dims: []int64{2, 3}, Data: make([]float32, 6)}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		inputs  map[string]*onnx.Tensor
		outputs []string
		want    []string // substrings of the error
	}{
		{"missing input", nil, map[string]*onnx.Tensor{}, nil, []string{`input "x": missing`}},
		{"unknown input", nil, map[string]*onnx.Tensor{"x": ok, "z": ok}, nil, []string{`input "z"`, "not an input", `"x"`}},
		{"unknown output", nil, map[string]*onnx.Tensor{"x": ok}, []string{"w"}, []string{`output "w"`, `"y"`}},
		{"wrong element type", nil, map[string]*onnx.Tensor{"x": {Type: onnx.Int32, Dims: []int64{2, 3}, Data: make([]int32, 6)}},
			nil, []string{`input "x"`, "int32", "float32"}},
		{"data does not match type", nil, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{2, 3}, Data: make([]int32, 6)}},
			nil, []string{`input "x"`, "[]int32"}},
		{"too few elements", nil, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{2, 3}, Data: make([]float32, 5)}},
			nil, []string{`input "x"`, "5 elements"}},
		{"wrong rank", nil, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{6}, Data: make([]float32, 6)}},
			nil, []string{`input "x"`, "rank 1", "rank 2", "[N,3]"}},
		{"wrong fixed dim", nil, map[string]*onnx.Tensor{"x": {Type: onnx.Float, Dims: []int64{3, 2}, Data: make([]float32, 6)}},
			nil, []string{`input "x"`, "dimension 1 is 2", "fixes it to 3"}},
		{"cancelled", cancelled, map[string]*onnx.Tensor{"x": ok}, nil, []string{"context canceled"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			_, err := s.Run(ctx, tc.inputs, tc.outputs)
			if err == nil {
				t.Fatal("Run succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run error %q does not contain %q", err, w)
				}
			}
		})
	}
	if _, err := s.Run(cancelled, map[string]*onnx.Tensor{"x": ok}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled) = %v, want context.Canceled", err)
	}
	s.Close()
	if _, err := s.Run(context.Background(), map[string]*onnx.Tensor{"x": ok}, nil); !errors.Is(err, ort.ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestSessionInfo(t *testing.T) {
	ortest.Init(t)
	s, err := ort.NewSessionFromBytes(identityModel(t, "Identity", onnx.Int64, onnx.Int64, dynNx3), ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []ort.IOInfo{{Name: "x", Kind: "tensor", Type: onnx.Int64, Ranked: true, Dims: []int64{-1, 3}, Params: []string{"N", ""}}}
	if got := s.Inputs(); !reflect.DeepEqual(got, want) {
		t.Errorf("Inputs() = %+v, want %+v", got, want)
	}
	want[0].Name = "y"
	if got := s.Outputs(); !reflect.DeepEqual(got, want) {
		t.Errorf("Outputs() = %+v, want %+v", got, want)
	}
}

// TestConcurrentRun shares one session between goroutines.
func TestConcurrentRun(t *testing.T) {
	ortest.Init(t)
	s, err := ort.NewSession(testutil.Corpus(t, "onnx-node", "pytorch-converted", "test_Conv2d", "model.onnx"), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := onnx.Load(testutil.Corpus(t, "onnx-node", "pytorch-converted", "test_Conv2d", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	in, want := testData(t, m, testutil.Corpus(t, "onnx-node", "pytorch-converted", "test_Conv2d"))
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 4 {
		wg.Go(func() {
			for range 5 {
				got, err := s.Run(context.Background(), in, nil)
				if err != nil {
					errs <- err.Error()
					return
				}
				for name, w := range want {
					if msg := closeTo(got[name], w, 1e-3, 1e-7); msg != "" {
						errs <- msg
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// BenchmarkRun times one inference of a small convolution.
func BenchmarkRun(b *testing.B) {
	ortest.Init(b)
	dir := testutil.Corpus(b, "onnx-node", "pytorch-converted", "test_Conv2d")
	m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
	if err != nil {
		b.Fatal(err)
	}
	in, _ := testData(b, m, dir)
	s, err := ort.NewSession(filepath.Join(dir, "model.onnx"), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := s.Run(ctx, in, nil); err != nil {
			b.Fatal(err)
		}
	}
}
