package dataset

import (
	"bytes"
	"context"
	"errors"
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

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "notes.txt"), []byte("x"), 0o644)
	mixed := t.TempDir()
	os.WriteFile(filepath.Join(mixed, "a.png"), pngOf(t, 1, 1, grad), 0o644)
	var buf bytes.Buffer
	WriteNpy(&buf, mustTensor(t, "x", []int64{1}, []float32{1}))
	os.WriteFile(filepath.Join(mixed, "b.npy"), buf.Bytes(), 0o644)

	tests := []struct {
		name string
		spec Spec
		fsys FS
		want string
		is   error
	}{
		{"gs without backend", Spec{Path: "gs://bucket/calib"}, nil, "opening dataset gs://bucket/calib: gs:// sources need the GCS backend", ErrNeedGCS},
		{"gs through Local", Spec{Path: "gs://bucket/calib"}, Local{}, "gs:// sources need the GCS backend", ErrNeedGCS},
		{"empty", Spec{Path: empty}, nil, "no samples found in " + empty + ": expected images (.jpg, .png), .npy/.npz, .pb, .tfrecord or .json", ErrNoSamples},
		{"empty tfrecord", Spec{Path: filepath.Join(empty, "x.tfrecord")}, nil, "no such file", os.ErrNotExist},
		{"mixed", Spec{Path: mixed}, nil, "directory mixes images, numpy files: choose one format", nil},
		{"missing", Spec{Path: filepath.Join(empty, "nope")}, nil, "no such file", os.ErrNotExist},
		{"format", Spec{Path: empty, Format: "csv"}, nil, `unknown dataset format "csv"`, nil},
		{"no path", Spec{}, nil, "dataset path is empty", nil},
		{"images for two inputs", Spec{Path: mixed, Format: Images, Inputs: []onnx.ValueInfo{floatInput("a", -1, 3), floatInput("b", -1, 3)}}, nil, `images feed one input, but the model has inputs ["a" "b"]`, nil},
	}
	for _, tt := range tests {
		_, err := Open(ctx, tt.spec, tt.fsys)
		if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.is != nil && !errors.Is(err, tt.is)) {
			t.Errorf("%s: Open() = %v, want %q", tt.name, err, tt.want)
		}
	}
	// An explicit format picks one kind out of a mixed directory.
	src, err := Open(ctx, Spec{Path: mixed, Format: NumPy}, nil)
	if err != nil || src.Len() != 1 {
		t.Errorf("Open(mixed, numpy) = %v, %v, want 1 sample", src, err)
	}
}

// TestCorpusONNXNode opens every onnx backend test's test_data_set_0 with
// the model's signature and checks each sample fits it.
func TestCorpusONNXNode(t *testing.T) {
	root := testutil.Corpus(t, "onnx-node")
	models, _ := filepath.Glob(filepath.Join(root, "*", "model.onnx"))
	more, _ := filepath.Glob(filepath.Join(root, "*", "*", "model.onnx"))
	models = append(models, more...)
	if len(models) < 50 {
		t.Fatalf("found %d onnx-node models, want the 62 of the corpus", len(models))
	}
	ctx := context.Background()
	for _, m := range models {
		dir := filepath.Dir(m)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			model, err := onnx.Load(m)
			if err != nil {
				t.Fatal(err)
			}
			sig := model.Inputs()
			src, err := Open(ctx, Spec{Path: dir, Inputs: sig}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Batches of the model's own batch size give back the stored tensors.
			size := 1
			if Batched(sig) && sig[0].Shape.Dims[0].Known {
				size = int(sig[0].Shape.Dims[0].Value)
			}
			n := 0
			for b, err := range Batches(ctx, src, nil, BatchOptions{Size: size, Inputs: sig}) {
				if err != nil {
					t.Fatal(err)
				}
				n++
				for i, v := range sig {
					want := readPB(t, filepath.Join(dir, "test_data_set_0", "input_"+itoa(i)+".pb"))
					got := b.Tensors[v.Name]
					if got == nil || !slices.Equal(got.Dims, want.Dims) || !bytes.Equal(onnx.RawBytes(got), onnx.RawBytes(want)) {
						t.Errorf("batch tensor %s = %v, want the stored %v", v.Name, got, want.Dims)
					}
				}
			}
			if n != 1 {
				t.Errorf("%d batches, want 1", n)
			}
		})
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func readPB(t *testing.T, p string) *onnx.Tensor {
	t.Helper()
	src, err := Open(context.Background(), Spec{Path: p, Inputs: []onnx.ValueInfo{{Name: "x", Kind: "tensor"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := src.Sample(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return s.Tensors["x"]
}

func TestCheckAndConform(t *testing.T) {
	sig := []onnx.ValueInfo{floatInput("x", -1, 3, 2), intInput("ids", onnx.Int64, -1, -1)}
	f16sig := []onnx.ValueInfo{floatInput("x", -1, 3, 2)}
	f16sig[0].Type = onnx.Float16
	x := mustTensor(t, "x", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 0.1})
	x1 := mustTensor(t, "x", []int64{1, 3, 2}, []float32{1, 2, 3, 4, 5, 0.1})
	ids := mustTensor(t, "ids", []int64{4}, []int64{1, 2, 3, 4})
	s := func(ts ...*onnx.Tensor) Sample {
		out := Sample{ID: "s.npz", Tensors: map[string]*onnx.Tensor{}}
		for _, t := range ts {
			out.Tensors[t.Name] = t
		}
		return out
	}
	tests := []struct {
		name    string
		sig     []onnx.ValueInfo
		in      Sample
		check   string // Check's error, "" for none
		conform string
	}{
		{"fits", sig, s(x, ids), "", ""},
		{"batch of 1", sig, s(x1, ids), `sample s.npz: tensor "x": shape [1 3 2], want [3,2]`, ""},
		{"missing", sig, s(x), `sample s.npz: tensor "ids": missing (sample has ["x"])`, `tensor "ids": missing`},
		{"extra", sig, s(x, ids, mustTensor(t, "y", nil, []float32{1})), `tensor "y": not a model input (inputs: ["x" "ids"])`, "not a model input"},
		{"dtype", sig, s(x, mustTensor(t, "ids", []int64{4}, []int32{1, 2, 3, 4})), `sample s.npz: tensor "ids": element type int32, want int64`, "element type int32, want int64"},
		{"shape", sig, s(mustTensor(t, "x", []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6}), ids), `tensor "x": shape [2 3], want [3,2]`, "shape [2 3], want [3,2]"},
		{"fp16", f16sig, s(x1), "element type float32, want float16", ""},
	}
	for _, tt := range tests {
		err := Check(tt.sig, tt.in)
		if (tt.check == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.check)) {
			t.Errorf("%s: Check() = %v, want %q", tt.name, err, tt.check)
		}
		got, err := Conform(tt.sig, tt.in)
		if (tt.conform == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.conform)) {
			t.Errorf("%s: Conform() = %v, want %q", tt.name, err, tt.conform)
		}
		if tt.name == "fp16" && err == nil {
			h := got.Tensors["x"]
			if h.Type != onnx.Float16 || !slices.Equal(h.Dims, []int64{3, 2}) || h.Data.([]float16.Float16)[5] != float16.Fromfloat32(0.1) {
				t.Errorf("Conform(fp16) = %v %v %v", h.Type, h.Dims, h.Data)
			}
			if x1.Type != onnx.Float {
				t.Error("Conform changed its input")
			}
		}
	}
}

// memSource is samples in memory, for batching tests.
type memSource []Sample

func (m memSource) Len() int { return len(m) }
func (m memSource) Sample(_ context.Context, i int) (Sample, error) {
	return m[i], nil
}

func TestBatches(t *testing.T) {
	ctx := context.Background()
	var src memSource
	for i := range 5 {
		src = append(src, Sample{ID: itoa(i), Label: int64(i), Tensors: map[string]*onnx.Tensor{
			"x": mustTensor(t, "x", []int64{2}, []float32{float32(i), float32(10 * i)}),
		}})
	}
	collect := func(order []int, opts BatchOptions) (ids [][]string, data []any, err error) {
		for b, err := range Batches(ctx, src, order, opts) {
			if err != nil {
				return ids, data, err
			}
			ids = append(ids, b.IDs)
			data = append(data, b.Tensors["x"].Data)
			if d := b.Tensors["x"].Dims; d[0] != int64(len(b.IDs)) || d[1] != 2 {
				return ids, data, errors.New("bad dims")
			}
		}
		return ids, data, nil
	}
	ids, data, err := collect(nil, BatchOptions{Size: 2})
	if want := [][]string{{"0", "1"}, {"2", "3"}, {"4"}}; err != nil || !reflect.DeepEqual(ids, want) {
		t.Errorf("Batches(size 2) = %v, %v, want %v", ids, err, want)
	}
	if want := []float32{2, 20, 3, 30}; !reflect.DeepEqual(data[1], want) {
		t.Errorf("Batches(size 2) batch 1 = %v, want %v", data[1], want)
	}
	ids, _, err = collect([]int{4, 0, 3}, BatchOptions{Size: 2, DropLast: true})
	if want := [][]string{{"4", "0"}}; err != nil || !reflect.DeepEqual(ids, want) {
		t.Errorf("Batches(order, drop last) = %v, %v, want %v", ids, err, want)
	}
	for _, tt := range []struct {
		opts BatchOptions
		want string
	}{
		{BatchOptions{Size: 0}, "batch size 0: must be at least 1"},
		{BatchOptions{Size: 2, Inputs: []onnx.ValueInfo{floatInput("x", 1, 2)}}, `model input "x" has a fixed batch dimension of 1`},
		{BatchOptions{Size: 2, Inputs: []onnx.ValueInfo{floatInput("x")}}, "no common batch dimension"},
		{BatchOptions{Size: 2, Inputs: []onnx.ValueInfo{floatInput("x", -1, 3)}}, `sample 0: tensor "x": shape [2], want [3]`},
	} {
		if _, _, err := collect(nil, tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Batches(%+v) = %v, want %q", tt.opts, err, tt.want)
		}
	}
	src[3].Tensors["x"] = mustTensor(t, "x", []int64{3}, []float32{1, 2, 3})
	if _, _, err := collect(nil, BatchOptions{Size: 5}); err == nil || !strings.Contains(err.Error(), `sample 3: tensor "x": float32[3] cannot be batched with float32[2] of sample 0`) {
		t.Errorf("Batches(ragged) = %v", err)
	}
}

func TestSelect(t *testing.T) {
	tests := []struct {
		n, total int
		seed     int64
	}{{10, 100, 1}, {10, 100, 2}, {99, 100, 0}, {1, 1000000, 42}, {100, 10000, 7}}
	for _, tt := range tests {
		a, b := Select(tt.n, tt.total, tt.seed), Select(tt.n, tt.total, tt.seed)
		if !reflect.DeepEqual(a, b) || len(a) != tt.n || !slices.IsSorted(a) || a[len(a)-1] >= tt.total || len(slices.Compact(slices.Clone(a))) != tt.n {
			t.Errorf("Select(%d, %d, %d) = %v, want %d sorted distinct picks, the same each time", tt.n, tt.total, tt.seed, a, tt.n)
		}
	}
	if a, b := Select(10, 100, 1), Select(10, 100, 2); reflect.DeepEqual(a, b) {
		t.Errorf("Select with seeds 1 and 2 both = %v", a)
	}
	// Fixed picks: the generator is kiln's own, so these never change.
	if got, want := Select(5, 100, 1), []int{25, 28, 61, 66, 67}; !reflect.DeepEqual(got, want) {
		t.Errorf("Select(5, 100, 1) = %v, want %v", got, want)
	}
	if got := Select(0, 3, 9); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Errorf("Select(0, 3, 9) = %v, want all", got)
	}
	if got := Select(5, 0, 1); got != nil {
		t.Errorf("Select(5, 0, 1) = %v, want none", got)
	}
}

func TestSplit(t *testing.T) {
	idx := Select(0, 10, 0)
	tests := []struct {
		calib     float64
		wantCalib []int
		wantErr   string
	}{
		{0.5, []int{0, 2, 4, 6, 8}, ""},
		{3, []int{0, 3, 6}, ""},
		{0.25, []int{0, 3, 6}, ""}, // round(2.5) = 3
		{0, nil, ""},
		{10, idx, ""},
		{11, nil, "more than the 10 samples"},
		{2.5, nil, "not a whole number"},
		{-1, nil, "want a fraction"},
	}
	for _, tt := range tests {
		c, v, err := Split(idx, tt.calib)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Split(%v) error = %v, want %q", tt.calib, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(c, tt.wantCalib) {
			t.Errorf("Split(%v) = %v, %v, want %v", tt.calib, c, err, tt.wantCalib)
		}
		all := slices.Sorted(slices.Values(append(slices.Clone(c), v...)))
		if !reflect.DeepEqual(all, idx) {
			t.Errorf("Split(%v) = %v + %v, want a partition of %v", tt.calib, c, v, idx)
		}
	}
}

func TestLocalListFollowsLinks(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	os.Mkdir(data, 0o755)
	os.WriteFile(filepath.Join(data, "a.png"), pngOf(t, 1, 1, grad), 0o644)
	os.WriteFile(filepath.Join(data, ".hidden.png"), pngOf(t, 1, 1, grad), 0o644)
	os.Symlink(filepath.Join(data, "a.png"), filepath.Join(data, "b.png"))
	link := filepath.Join(dir, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Skip(err)
	}
	got, err := listSorted(context.Background(), Local{}, link)
	if want := []string{filepath.Join(link, "a.png"), filepath.Join(link, "b.png")}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("List(%s) = %v, %v, want %v", link, got, err, want)
	}
}

// TestBatchSlice: a slice of a batch is its samples [i, j), sharing the
// batch's memory; the whole range is the batch itself, and a batch with a
// tensor not stacked by sample cannot be sliced.
func TestBatchSlice(t *testing.T) {
	x := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	b := &Batch{
		IDs: []string{"a", "b", "c", "d"}, Labels: []int64{10, 11, 12, 13},
		Tensors: map[string]*onnx.Tensor{
			"x":   {Name: "x", Type: onnx.Float, Dims: []int64{4, 2}, Data: x},
			"ids": {Name: "ids", Type: onnx.Int64, Dims: []int64{4}, Data: []int64{7, 8, 9, 10}},
		},
	}
	s := b.Slice(1, 3)
	if !slices.Equal(s.IDs, []string{"b", "c"}) || !slices.Equal(s.Labels, []int64{11, 12}) {
		t.Errorf("Slice(1, 3): IDs %v labels %v, want [b c] [11 12]", s.IDs, s.Labels)
	}
	if got := s.Tensors["x"]; !slices.Equal(got.Dims, []int64{2, 2}) || !slices.Equal(got.Data.([]float32), []float32{2, 3, 4, 5}) {
		t.Errorf("Slice(1, 3) x = %v %v, want [2 2] [2 3 4 5]", got.Dims, got.Data)
	}
	if got := s.Tensors["ids"].Data.([]int64); !slices.Equal(got, []int64{8, 9}) {
		t.Errorf("Slice(1, 3) ids = %v, want [8 9]", got)
	}
	s.Tensors["x"].Data.([]float32)[0] = 42
	if x[2] != 42 {
		t.Error("Slice copied the data; want it shared with the batch")
	}
	if b.Slice(0, 4) != b {
		t.Error("Slice(0, 4) is not the batch itself")
	}
	b.Tensors["scalar"] = &onnx.Tensor{Name: "scalar", Type: onnx.Float, Dims: []int64{}, Data: []float32{1}}
	if b.Slice(0, 2) != nil {
		t.Error("Slice of a batch with an unstacked tensor is not nil")
	}
}
