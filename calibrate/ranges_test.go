package calibrate

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/manifest"
)

func sampleRanges() Ranges {
	return Ranges{
		Version:       RangesVersion,
		ModelDigest:   "sha256:aa",
		DatasetDigest: "sha256:bb",
		Method:        Entropy,
		Samples:       64,
		Tensors: []TensorRange{
			{Tensor: "relu", Method: Entropy, Amax: 6.5, Scale: 6.5 / 127, Min: 0, Max: 7.25, Samples: 64, Detail: "entropy: cut at bin 1834 of 2048"},
			{Tensor: "input_1:0", Method: MinMax, Amax: 1, Scale: 1.0 / 127, Min: -1, Max: 1, Samples: 64},
		},
	}
}

func TestRangesMarshalExact(t *testing.T) {
	got, err := sampleRanges().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{
  "version": 1,
  "model_digest": "sha256:aa",
  "dataset_digest": "sha256:bb",
  "method": "entropy",
  "samples": 64,
  "tensors": [
    {
      "tensor": "input_1:0",
      "method": "minmax",
      "amax": 1,
      "scale": 0.007874015748031496,
      "min": -1,
      "max": 1,
      "samples": 64
    },
    {
      "tensor": "relu",
      "method": "entropy",
      "amax": 6.5,
      "scale": 0.051181102362204724,
      "min": 0,
      "max": 7.25,
      "samples": 64,
      "detail": "entropy: cut at bin 1834 of 2048"
    }
  ]
}
`
	if string(got) != want {
		t.Errorf("Marshal() =\n%s\nwant\n%s", got, want)
	}
	// Input order does not change the bytes.
	r := sampleRanges()
	r.Tensors[0], r.Tensors[1] = r.Tensors[1], r.Tensors[0]
	if again, _ := r.Marshal(); string(again) != string(got) {
		t.Errorf("Marshal() depends on the order of Tensors")
	}
}

func TestRangesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ranges.json")
	in := sampleRanges()
	if err := WriteRanges(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadRanges(path)
	if err != nil {
		t.Fatal(err)
	}
	in.Tensors[0], in.Tensors[1] = in.Tensors[1], in.Tensors[0] // sorted on write
	if !reflect.DeepEqual(in, out) {
		t.Errorf("ReadRanges(WriteRanges(r)) = %+v, want %+v", out, in)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("WriteRanges left %d files, want 1 (no temporaries)", len(entries))
	}
	if m := out.ORTTable(); m["relu"] != 6.5 || m["input_1:0"] != 1 {
		t.Errorf("ORTTable() = %v", m)
	}
}

// From a histogram to a ranges file, a cache and an ORT table.
func TestRangesFromHistogram(t *testing.T) {
	h := histOf(t, gaussian(1<<16, 1, 1))
	r := compute(t, Entropy, h, MethodOptions{})
	tr := NewTensorRange("x", 8, h, r)
	if tr.Min != h.Min() || tr.Max != h.Max() || tr.Amax != r.Amax || tr.Scale != r.Scale || tr.Samples != 8 {
		t.Errorf("NewTensorRange = %+v", tr)
	}
	rs := Ranges{Version: RangesVersion, Method: Entropy, Samples: 8, Tensors: []TensorRange{tr}}
	data, err := rs.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseRanges(data)
	if err != nil || back.Tensors[0] != tr {
		t.Errorf("ParseRanges(Marshal(r)) = %+v, %v, want %+v", back.Tensors, err, tr)
	}
	c := rs.Cache(manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1})
	if a, _ := c.Amax("x"); math.Abs(float64(a)-r.Amax) > 1e-6*r.Amax {
		t.Errorf("Cache.Amax(x) = %v, want %v", a, r.Amax)
	}
}

func TestRangesInvalid(t *testing.T) {
	tests := []struct {
		name string
		edit func(r *Ranges)
		want string
	}{
		{"version", func(r *Ranges) { r.Version = 2 }, "ranges version 2 is not supported"},
		{"method", func(r *Ranges) { r.Method = "kl" }, `unknown calibration method "kl"`},
		{"duplicate", func(r *Ranges) { r.Tensors[1].Tensor = "relu" }, `tensor "relu" appears twice`},
		{"no name", func(r *Ranges) { r.Tensors[0].Tensor = "" }, "tensor 0 has no name"},
		{"zero scale", func(r *Ranges) { r.Tensors[0].Scale = 0 }, `tensor "relu": scale 0 is not a positive float32`},
		{"scale underflows float32", func(r *Ranges) { r.Tensors[0].Scale = 1e-50 }, "not a positive float32"},
		{"nan amax", func(r *Ranges) { r.Tensors[0].Amax = math.NaN() }, "amax NaN"},
		{"tensor method", func(r *Ranges) { r.Tensors[0].Method = "" }, `tensor "relu": unknown calibration method`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRanges()
			tt.edit(&r)
			path := filepath.Join(t.TempDir(), "ranges.json")
			err := WriteRanges(path, r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteRanges error = %v, want %q", err, tt.want)
			}
			if _, statErr := os.Stat(path); statErr == nil {
				t.Errorf("WriteRanges wrote %s despite the error", path)
			}
		})
	}
	for _, tt := range []struct{ name, in, want string }{
		{"unknown field", `{"version":1,"tensors":[],"extra":1}`, `unknown field "extra"`},
		{"trailing data", `{"version":1,"tensors":[]} {}`, "data after"},
		{"not json", `TRT-8600-EntropyCalibration2`, "invalid character"},
		{"bad scale", `{"version":1,"tensors":[{"tensor":"a","method":"minmax","amax":1,"scale":-1}]}`, "scale -1"},
	} {
		if _, err := ParseRanges([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseRanges(%s) error = %v, want %q", tt.name, err, tt.want)
		}
	}
}
