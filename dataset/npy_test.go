package dataset

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

func mustTensor(t testing.TB, name string, dims []int64, data any) *onnx.Tensor {
	t.Helper()
	x, err := onnx.NewTensor(name, dims, data)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func sameTensor(a, b *onnx.Tensor) bool {
	return a.Type == b.Type && slices.Equal(a.Dims, b.Dims) &&
		bytes.Equal(onnx.RawBytes(a), onnx.RawBytes(b)) && (a.Type != onnx.String || reflect.DeepEqual(a.Data, b.Data))
}

func TestNpyRoundTrip(t *testing.T) {
	tests := []struct {
		descr string
		t     *onnx.Tensor
	}{
		{"<f4", mustTensor(t, "x", []int64{2, 3}, []float32{0, 1.5, -2, 3e38, 1e-40, -0})},
		{"<f8", mustTensor(t, "x", []int64{2}, []float64{1.25, -1e300})},
		{"<f2", mustTensor(t, "x", []int64{3}, []float16.Float16{float16.Fromfloat32(1), float16.Fromfloat32(-0.5), float16.Inf(1)})},
		{"|i1", mustTensor(t, "x", []int64{2}, []int8{-128, 127})},
		{"|u1", mustTensor(t, "x", []int64{2}, []uint8{0, 255})},
		{"<i2", mustTensor(t, "x", []int64{2}, []int16{-32768, 32767})},
		{"<u2", mustTensor(t, "x", []int64{2}, []uint16{0, 65535})},
		{"<i4", mustTensor(t, "x", []int64{1, 2}, []int32{-1 << 31, 1<<31 - 1})},
		{"<u4", mustTensor(t, "x", []int64{2}, []uint32{0, 1<<32 - 1})},
		{"<i8", mustTensor(t, "x", []int64{2}, []int64{-1 << 63, 1<<63 - 1})},
		{"<u8", mustTensor(t, "x", []int64{2}, []uint64{0, 1<<64 - 1})},
		{"|b1", mustTensor(t, "x", []int64{3}, []bool{true, false, true})},
		{"<f4", mustTensor(t, "x", []int64{}, []float32{7})},         // scalar
		{"<f4", mustTensor(t, "x", []int64{0, 4}, []float32{})},      // empty
		{"<i8", mustTensor(t, "x", []int64{1, 1, 1, 1}, []int64{9})}, // rank 4
	}
	for _, tt := range tests {
		t.Run(tt.descr+tt.t.Type.String(), func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteNpy(&buf, tt.t); err != nil {
				t.Fatalf("WriteNpy: %v", err)
			}
			b := buf.Bytes()
			hlen := 10 + int(b[8]) + int(b[9])<<8
			if hlen%64 != 0 || !strings.Contains(string(b[:hlen]), "'descr': '"+tt.descr+"'") {
				t.Errorf("WriteNpy header = %q, want descr %s and 64-byte alignment", b[:hlen], tt.descr)
			}
			got, err := ReadNpy(bytes.NewReader(b), "x")
			if err != nil {
				t.Fatalf("ReadNpy: %v", err)
			}
			if !sameTensor(got, tt.t) {
				t.Errorf("ReadNpy(WriteNpy(x)) = %v %v %v, want %v %v %v", got.Type, got.Dims, got.Data, tt.t.Type, tt.t.Dims, tt.t.Data)
			}
		})
	}
}

// npyFile builds a .npy file by hand, for headers WriteNpy does not write.
func npyFile(major byte, dict string, data []byte) []byte {
	b := []byte(npyMagic)
	hl := len(dict) + 1
	if major == 1 {
		b = append(b, 1, 0, byte(hl), byte(hl>>8))
	} else {
		b = append(b, major, 0, byte(hl), byte(hl>>8), byte(hl>>16), byte(hl>>24))
	}
	b = append(b, dict+"\n"...)
	return append(b, data...)
}

func TestReadNpyHeaders(t *testing.T) {
	one := []byte{0, 0, 0x80, 0x3f} // 1.0 little-endian
	tests := []struct {
		name    string
		file    []byte
		want    *onnx.Tensor
		wantErr string
	}{
		{"v2", npyFile(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", one), mustTensor(t, "x", []int64{1}, []float32{1}), ""},
		{"v3", npyFile(3, `{"descr": "<f4", "fortran_order": False, "shape": (1, 1)}`, one), mustTensor(t, "x", []int64{1, 1}, []float32{1}), ""},
		{"big-endian", npyFile(1, "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", []byte{0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe}), mustTensor(t, "x", []int64{2}, []int32{1, -2}), ""},
		{"big-endian f2", npyFile(1, "{'descr': '>f2', 'fortran_order': False, 'shape': (), }", []byte{0x3c, 0}), mustTensor(t, "x", []int64{}, []float16.Float16{float16.Fromfloat32(1)}), ""},
		{"python2 long", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1L,), }", one), mustTensor(t, "x", []int64{1}, []float32{1}), ""},
		{"fortran", npyFile(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", one), nil, "Fortran-order"},
		{"strings", npyFile(1, "{'descr': '<U5', 'fortran_order': False, 'shape': (1,), }", nil), nil, `dtype "<U5" is not supported`},
		{"object", npyFile(1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", nil), nil, `dtype "|O" is not supported`},
		{"truncated", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", one), nil, "truncated file"},
		{"version 4", npyFile(4, "{}", nil), nil, "version 4.0 is not supported"},
		{"no magic", []byte("PK\x03\x04 not npy"), nil, "not a .npy file"},
		{"missing key", npyFile(1, "{'descr': '<f4', 'shape': (1,), }", one), nil, "want keys descr, fortran_order and shape"},
		{"negative dim", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", one), nil, "want a non-negative integer"},
		{"empty", nil, nil, "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadNpy(bytes.NewReader(tt.file), "x")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ReadNpy() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadNpy() = %v", err)
			}
			if !sameTensor(got, tt.want) {
				t.Errorf("ReadNpy() = %v%v %v, want %v%v %v", got.Type, got.Dims, got.Data, tt.want.Type, tt.want.Dims, tt.want.Data)
			}
		})
	}
}

func TestWriteNpyRefuses(t *testing.T) {
	for _, x := range []*onnx.Tensor{
		mustTensor(t, "s", []int64{1}, []string{"a"}),
		mustTensor(t, "b", []int64{1}, []onnx.BF16{1}),
		{Name: "wrong", Type: onnx.Float, Dims: []int64{1}, Data: []float64{1}},
		{Name: "count", Type: onnx.Float, Dims: []int64{2}, Data: []float32{1}},
	} {
		if err := WriteNpy(&bytes.Buffer{}, x); err == nil || !strings.Contains(err.Error(), x.Name) {
			t.Errorf("WriteNpy(%s) = %v, want an error naming the tensor", x.Name, err)
		}
	}
}

func TestCorpusNpz(t *testing.T) {
	dir := testutil.Corpus(t, "models", "model-navigator", "torch_linear", "model_input", "correctness")
	ctx := context.Background()
	src, err := Open(ctx, Spec{Path: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 10 {
		t.Fatalf("Open(%s).Len() = %d, want 10", dir, src.Len())
	}
	s, err := src.Sample(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	in := s.Tensors["input"]
	if want := filepath.Join(dir, "3.npz"); s.ID != want || in == nil || in.Type != onnx.Float || !reflect.DeepEqual(in.Dims, []int64{5}) {
		t.Fatalf("Sample(3) = %s %v, want %s with input float32[5]", s.ID, s.Tensors, want)
	}
	// The matching output file reads the same way.
	out := testutil.Corpus(t, "models", "model-navigator", "torch_linear", "model_output", "correctness", "3.npz")
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	ts, err := ReadNpz(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	if o := ts["output__0"]; o == nil || o.Type != onnx.Float || !reflect.DeepEqual(o.Dims, []int64{7}) {
		t.Errorf("ReadNpz(%s) = %v, want output__0 float32[7]", out, ts)
	}
	// A signature with a batch dimension accepts them through Conform.
	sig := []onnx.ValueInfo{{Name: "input", Kind: "tensor", Type: onnx.Float, Shape: onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Param: "batch"}, {Value: 5, Known: true}}}}}
	n := 0
	for b, err := range Batches(ctx, src, nil, BatchOptions{Size: 4, Inputs: sig}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if got := b.Tensors["input"].Dims; got[1] != 5 || (n < 3 && got[0] != 4) || (n == 3 && got[0] != 2) {
			t.Errorf("batch %d dims = %v", n, got)
		}
	}
	if n != 3 {
		t.Errorf("Batches(10 samples, size 4) gave %d batches, want 3", n)
	}
}

func TestStackedNpz(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	x := mustTensor(t, "x", []int64{4, 2}, []float32{0, 1, 2, 3, 4, 5, 6, 7})
	y := mustTensor(t, "y", []int64{4}, []int64{10, 11, 12, 13})
	var buf bytes.Buffer
	if err := WriteNpz(&buf, map[string]*onnx.Tensor{"x": x, "y": y}); err != nil {
		t.Fatal(err)
	}
	npz := filepath.Join(dir, "data.npz")
	os.WriteFile(npz, buf.Bytes(), 0o644)
	buf.Reset()
	WriteNpy(&buf, x)
	npy := filepath.Join(dir, "x.npy")
	os.WriteFile(npy, buf.Bytes(), 0o644)

	for _, tt := range []struct {
		path string
		sig  []onnx.ValueInfo
		want int
	}{
		{npz, nil, 4},
		{npy, nil, 4},
		{npz, []onnx.ValueInfo{floatInput("x", -1, 2), {Name: "y", Type: onnx.Int64, Shape: onnx.Shape{Ranked: true, Dims: []onnx.Dim{{}}}}}, 4},
	} {
		src, err := Open(ctx, Spec{Path: tt.path, Inputs: tt.sig}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if src.Len() != tt.want {
			t.Fatalf("Open(%s).Len() = %d, want %d", tt.path, src.Len(), tt.want)
		}
		s, err := src.Sample(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		name := "x"
		if strings.HasSuffix(tt.path, ".npy") {
			name = "input"
		}
		if got := s.Tensors[name].Data; !reflect.DeepEqual(got, []float32{4, 5}) || s.ID != tt.path+"#2" {
			t.Errorf("Open(%s).Sample(2) = %s %v, want %s#2 [4 5]", tt.path, s.ID, got, tt.path)
		}
		if y := s.Tensors["y"]; name == "x" && (y == nil || !reflect.DeepEqual(y.Data, []int64{12}) || len(y.Dims) != 0) {
			t.Errorf("Open(%s).Sample(2) y = %v, want scalar 12", tt.path, y)
		}
	}
	// One sample per file when the arrays have the model's per-sample rank.
	src, err := Open(ctx, Spec{Path: npy, Inputs: []onnx.ValueInfo{floatInput("in", -1, 4, 2)}}, nil)
	if err != nil || src.Len() != 1 {
		t.Fatalf("Open(per-sample npy) = %v, %v; want 1 sample", src, err)
	}
}

func floatInput(name string, dims ...int64) onnx.ValueInfo {
	v := onnx.ValueInfo{Name: name, Kind: "tensor", Type: onnx.Float, Shape: onnx.Shape{Ranked: true}}
	for _, d := range dims {
		if d < 0 {
			v.Shape.Dims = append(v.Shape.Dims, onnx.Dim{Param: "N"})
		} else {
			v.Shape.Dims = append(v.Shape.Dims, onnx.Dim{Value: d, Known: true})
		}
	}
	return v
}

func FuzzNpy(f *testing.F) {
	for _, x := range []*onnx.Tensor{
		mustTensor(f, "x", []int64{2, 2}, []float32{1, 2, 3, 4}),
		mustTensor(f, "x", []int64{3}, []bool{true, false, true}),
		mustTensor(f, "x", []int64{}, []int64{-5}),
	} {
		var buf bytes.Buffer
		WriteNpy(&buf, x)
		f.Add(buf.Bytes())
	}
	f.Add(npyFile(3, `{"descr": ">u2", "fortran_order": False, "shape": (1,)}`, []byte{1, 2}))
	f.Add(npyFile(2, "{'descr': '|i1', 'fortran_order': False, 'shape': (2, 1), }", []byte{1, 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ReadNpy(bytes.NewReader(b), "x")
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := WriteNpy(&buf, x); err != nil {
			t.Fatalf("WriteNpy(ReadNpy(b)) = %v", err)
		}
		y, err := ReadNpy(&buf, "x")
		if err != nil {
			t.Fatalf("ReadNpy(WriteNpy(x)) = %v", err)
		}
		if !sameTensor(x, y) {
			t.Fatalf("round trip changed %v%v to %v%v", x.Type, x.Dims, y.Type, y.Dims)
		}
	})
}

func FuzzNpz(f *testing.F) {
	var buf bytes.Buffer
	WriteNpz(&buf, map[string]*onnx.Tensor{
		"a": mustTensor(f, "a", []int64{2}, []float32{1, 2}),
		"b": mustTensor(f, "b", []int64{1}, []uint8{7}),
	})
	f.Add(buf.Bytes())
	if b, err := os.ReadFile(testutil.CorpusPath(f, "models", "model-navigator", "torch_linear", "model_input", "correctness", "0.npz")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, err := ReadNpz(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteNpz(&out, ts); err != nil {
			t.Fatalf("WriteNpz(ReadNpz(b)) = %v", err)
		}
		again, err := ReadNpz(bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			t.Fatalf("ReadNpz(WriteNpz(x)) = %v", err)
		}
		if len(again) != len(ts) {
			t.Fatalf("round trip has %d arrays, want %d", len(again), len(ts))
		}
		for k, x := range ts {
			if y := again[k]; y == nil || !sameTensor(x, y) {
				t.Fatalf("round trip changed array %q", k)
			}
		}
	})
}
