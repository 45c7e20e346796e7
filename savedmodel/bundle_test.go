package savedmodel

import (
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
	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

func openModel(t *testing.T, elem ...string) (*Model, *Bundle) {
	t.Helper()
	m, err := Open(context.Background(), testutil.Corpus(t, append([]string{"savedmodel"}, elem...)...), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Bundle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m, b
}

func scalar(t *testing.T, b *Bundle, key string) float32 {
	t.Helper()
	tt, err := b.Tensor(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if tt.Type != onnx.Float || len(tt.Dims) != 0 || tt.Name != key {
		t.Fatalf("Tensor(%s) = %s%v named %q, want a float32 scalar", key, tt.Type, tt.Dims, tt.Name)
	}
	return tt.Data.([]float32)[0]
}

// half_plus_two computes y = a*x + b with a = 0.5 and b = 2: the TF1
// checkpoint keys are the variable names, the TF2 ones object-graph paths.
func TestBundleHalfPlusTwo(t *testing.T) {
	_, b := openModel(t, "tf-serving", "saved_model_half_plus_two_cpu")
	if got, want := b.Keys(), []string{"a", "a2", "b", "c", "c2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Keys() = %q, want %q", got, want)
	}
	for key, want := range map[string]float32{"a": 0.5, "b": 2, "c": 3} {
		if got := scalar(t, b, key); got != want {
			t.Errorf("Tensor(%s) = %v, want %v", key, got, want)
		}
	}
	if _, err := b.CheckpointKeys(context.Background()); !errors.Is(err, ErrNoObjectGraph) {
		t.Errorf("CheckpointKeys of a TF1 bundle = %v, want ErrNoObjectGraph", err)
	}

	m, b2 := openModel(t, "tf-serving", "saved_model_half_plus_two_tf2_cpu")
	if got := scalar(t, b2, "a/.ATTRIBUTES/VARIABLE_VALUE"); got != 0.5 {
		t.Errorf("TF2 a = %v, want 0.5", got)
	}
	mg, err := m.MetaGraph("")
	if err != nil {
		t.Fatal(err)
	}
	vars, err := VariableTensors(context.Background(), mg, b2)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]float32{}
	for id, tt := range vars {
		byName[mg.GetObjectGraphDef().GetNodes()[id].GetVariable().GetName()] = tt.Data.([]float32)[0]
	}
	if want := map[string]float32{"a": 0.5, "b": 2, "c": 3}; !reflect.DeepEqual(byName, want) {
		t.Errorf("VariableTensors by SavedVariable name = %v, want %v", byName, want)
	}
}

// Every variable of a real Keras model maps to a checkpoint entry of the
// variable's dtype and shape.
func TestCheckpointKeysKeras(t *testing.T) {
	for _, model := range []string{"basic-pitch-nmp", "mlperf-tiny-kws-dscnn"} {
		m, b := openModel(t, "real", model)
		mg, _ := m.MetaGraph("")
		vars, err := VariableTensors(context.Background(), mg, b)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for id, node := range mg.GetObjectGraphDef().GetNodes() {
			v := node.GetVariable()
			if v == nil {
				continue
			}
			n++
			dims, _ := Shape(v.GetShape())
			want, _ := ONNXType(v.GetDtype())
			if got := vars[int32(id)]; got == nil || got.Type != want || !slices.Equal(got.Dims, dims) {
				t.Errorf("%s: variable %d (%s) = %v, want %s%v", model, id, v.GetName(), got, want, dims)
			}
		}
		if n == 0 || len(vars) != n {
			t.Errorf("%s: %d variables read, %d in the object graph", model, len(vars), n)
		}
	}
}

// copyBundle copies a corpus bundle to a temp dir and returns its prefix.
func copyBundle(t *testing.T, elem ...string) string {
	t.Helper()
	src := testutil.Corpus(t, append([]string{"savedmodel"}, elem...)...)
	dst := filepath.Join(t.TempDir(), "variables")
	os.MkdirAll(dst, 0o755)
	for _, f := range []string{"variables.index", "variables.data-00000-of-00001"} {
		b, err := os.ReadFile(filepath.Join(src, "variables", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, f), b, 0o644)
	}
	return filepath.Join(dst, "variables")
}

func flipByte(t *testing.T, name string, at int64) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x40
	os.WriteFile(name, b, 0o644)
}

// A flipped byte in the data file fails the tensor it belongs to, naming
// the key and the file; the others still read.
func TestBundleCorruptData(t *testing.T) {
	ctx := context.Background()
	prefix := copyBundle(t, "tf-serving", "saved_model_half_plus_two_cpu", "00000123")
	b, err := OpenBundle(ctx, nil, prefix)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := b.Entry("b")
	file := DataFile(prefix, 0, 1)
	flipByte(t, file, e.GetOffset()+1)
	_, err = b.Tensor(ctx, "b")
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), file) {
		t.Errorf("Tensor(b) of a corrupt file = %v, want ErrChecksum naming b and %s", err, file)
	}
	if got := scalar(t, b, "a"); got != 0.5 {
		t.Errorf("Tensor(a) = %v, want 0.5", got)
	}
}

// A flipped byte anywhere in the index is caught: by a block checksum, the
// footer check, or the entry's own checks.
func TestBundleCorruptIndex(t *testing.T) {
	ctx := context.Background()
	prefix := copyBundle(t, "tf-serving", "saved_model_half_plus_two_cpu", "00000123")
	good, _ := os.ReadFile(prefix + ".index")
	for at := range int64(len(good)) {
		flipByte(t, prefix+".index", at)
		b, err := OpenBundle(ctx, nil, prefix)
		if err == nil {
			// Footer padding is not covered by any checksum.
			if _, err := b.Tensor(ctx, "a"); err != nil {
				t.Errorf("byte %d flipped: index opened but Tensor(a) = %v", at, err)
			}
		} else if !strings.Contains(err.Error(), "variables.index") {
			t.Errorf("byte %d flipped: %v, want an error naming the index", at, err)
		}
		os.WriteFile(prefix+".index", good, 0o644)
	}
}

// Bundles with what the corpus lacks: several shards, string vectors,
// empty strings and tensors, integer and fp16 types.
func TestBundleWritten(t *testing.T) {
	ctx := context.Background()
	tensors := []stored{
		{key: "names", dtype: smpb.DataType_DT_STRING, dims: []int64{3}, data: []string{"alpha", "", "γάμμα"}},
		{key: "empty", dtype: smpb.DataType_DT_STRING, dims: []int64{0}, data: []string{}},
		{key: "ids", dtype: smpb.DataType_DT_INT64, dims: []int64{2, 2}, data: []int64{1, -2, 3, 1 << 40}, shard: 1},
		{key: "mask", dtype: smpb.DataType_DT_BOOL, dims: []int64{3}, data: []bool{true, false, true}, shard: 1},
		{key: "zero", dtype: smpb.DataType_DT_FLOAT, dims: []int64{0, 4}, data: []float32{}},
	}
	prefix := writeBundle(t, filepath.Join(t.TempDir(), "variables", "variables"), 2, tensors)
	b, err := OpenBundle(ctx, nil, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.Keys(), []string{"empty", "ids", "mask", "names", "zero"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Keys() = %q, want %q", got, want)
	}
	for _, s := range tensors {
		got, err := b.Tensor(ctx, s.key)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Data, s.data) || !slices.Equal(got.Dims, s.dims) {
			t.Errorf("Tensor(%s) = %v%v, want %v%v", s.key, got.Data, got.Dims, s.data, s.dims)
		}
	}
	// A changed string byte, and a changed length checksum, both fail.
	e, _ := b.Entry("names")
	for _, at := range []int64{e.GetOffset() + 3, e.GetOffset() + e.GetSize() - 1} {
		flipByte(t, DataFile(prefix, 0, 2), at)
		if _, err := b.Tensor(ctx, "names"); !errors.Is(err, ErrChecksum) {
			t.Errorf("Tensor(names) with byte %d flipped = %v, want ErrChecksum", at, err)
		}
		flipByte(t, DataFile(prefix, 0, 2), at)
	}
	if _, err := b.Tensor(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Tensor(nope) = %v, want an error naming it", err)
	}
}

// Entries that kiln cannot read say why.
func TestBundleRefusals(t *testing.T) {
	h := mustMarshal(t, &smpb.BundleHeaderProto{NumShards: 1})
	sliced := mustMarshal(t, &smpb.BundleEntryProto{Dtype: smpb.DataType_DT_FLOAT, Slices: []*smpb.TensorSliceProto{{}}})
	res := mustMarshal(t, &smpb.BundleEntryProto{Dtype: smpb.DataType_DT_RESOURCE})
	cases := []struct {
		name string
		kvs  []kv
		key  string
		want string
	}{
		{"no header", []kv{{[]byte("a"), res}}, "", "no bundle header"},
		{"big endian", []kv{{nil, mustMarshal(t, &smpb.BundleHeaderProto{NumShards: 1, Endianness: smpb.BundleHeaderProto_BIG})}}, "", "big-endian"},
		{"newer", []kv{{nil, mustMarshal(t, &smpb.BundleHeaderProto{NumShards: 1, Version: &smpb.VersionDef{MinConsumer: 2}})}}, "", "newer"},
		{"bad shard", []kv{{nil, h}, {[]byte("a"), mustMarshal(t, &smpb.BundleEntryProto{ShardId: 3})}}, "", "outside"},
		{"sliced", []kv{{nil, h}, {[]byte("a"), sliced}}, "a", "partitioned"},
		{"resource", []kv{{nil, h}, {[]byte("a"), res}}, "a", "DT_RESOURCE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "v")
			os.WriteFile(prefix+".index", writeTable(t, c.kvs), 0o644)
			b, err := OpenBundle(context.Background(), nil, prefix)
			if c.key != "" && err == nil {
				_, err = b.Tensor(context.Background(), c.key)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}
