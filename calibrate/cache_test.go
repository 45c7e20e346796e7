package calibrate

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

// corpusCaches returns the TensorRT caches of the corpus after checking them
// against MANIFEST.tsv, or skips when the corpus is not checked out.
func corpusCaches(t *testing.T) map[string][]byte {
	t.Helper()
	list, err := os.ReadFile(testutil.Corpus(t, "MANIFEST.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 || !strings.HasPrefix(f[0], "calib-caches/") {
			continue
		}
		data, err := os.ReadFile(testutil.CorpusPath(t, f[0]))
		if err != nil {
			t.Fatal(err)
		}
		if manifest.DigestBytes(data).Hex() != f[2] || strconv.Itoa(len(data)) != f[1] {
			t.Fatalf("corpus file %s does not match MANIFEST.tsv", f[0])
		}
		files[filepath.Base(f[0])] = data
	}
	if len(files) == 0 {
		t.Fatalf("MANIFEST.tsv lists no calib-caches")
	}
	return files
}

func TestParseCacheCorpus(t *testing.T) {
	files := corpusCaches(t)
	want := map[string]struct {
		version int
		tensors int
		check   string // a tensor whose scale is known
		bits    uint32
		scale   float64
	}{
		"trt8.6_yolov5s_qat2ptq.cache":          {8600, 197, "images", 0x3c00f9f4, 0.00787209},
		"trt7.0_dynamicshape_calibration.cache": {7000, 2, "inputTensor", 0x3c00e995, 0.0078682},
		"trt10.0_plugin_v3_model.int8cache":     {100001, 3, "(Unnamed Layer* 0) [PluginV3_V3ONE]_output", 0x3ec3d80a, 0.38250762},
		"trt10.14_plugin_v2_model.int8cache":    {101401, 3, "(Unnamed Layer* 0) [PluginV2DynamicExt]_output", 0x3eb2a59f, 0.34891984},
	}
	if len(files) != len(want) {
		t.Errorf("corpus has %d caches, the test knows %d: add the new ones", len(files), len(want))
	}
	for name, data := range files {
		t.Run(name, func(t *testing.T) {
			w, ok := want[name]
			if !ok {
				t.Skipf("no expectations for %s", name)
			}
			c, err := ParseCache(data)
			if err != nil {
				t.Fatalf("ParseCache(%s) error: %v", name, err)
			}
			if c.Version != w.version || c.Algorithm != EntropyCalibration2 || len(c.Scales) != w.tensors || len(c.Names) != w.tensors {
				t.Errorf("ParseCache(%s) = version %d, algorithm %q, %d scales, %d names, want %d, %q, %d",
					name, c.Version, c.Algorithm, len(c.Scales), len(c.Names), w.version, EntropyCalibration2, w.tensors)
			}
			s, ok := c.Scales[w.check]
			if !ok || math.Float32bits(s) != w.bits || math.Abs(float64(s)-w.scale) > 5e-6*w.scale { // README values are rounded
				t.Errorf("ParseCache(%s).Scales[%q] = %v (%08x), want %v (%08x)", name, w.check, s, math.Float32bits(s), w.scale, w.bits)
			}
			if a, _ := c.Amax(w.check); math.Abs(float64(a)-127*w.scale) > 5e-6*127*w.scale {
				t.Errorf("Amax(%q) = %v, want %v", w.check, a, 127*w.scale)
			}
			release, err := manifest.TRTVersionFromNumber(strconv.Itoa(w.version))
			if err != nil {
				t.Fatalf("%s: header number %d: %v", name, w.version, err)
			}
			if err := CheckCompatible(c, release); err != nil {
				t.Errorf("CheckCompatible(%s, %d) = %v, want nil", name, w.version, err)
			}
			// TensorRT writes exactly our format: the writer's output is the
			// file with its tensor lines sorted.
			out, err := c.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitAfter(string(data), "\n")
			body := lines[1:]
			sort.Strings(body)
			if sorted := lines[0] + strings.Join(body, ""); string(out) != sorted {
				t.Errorf("Marshal(ParseCache(%s)) differs from the sorted file:\n%s", name, out)
			}
			again, err := ParseCache(out)
			if err != nil || !sameCache(c, again) {
				t.Errorf("ParseCache(Marshal(ParseCache(%s))) = %v, want the same cache", name, err)
			}
		})
	}
}

func sameCache(a, b Cache) bool {
	if a.Version != b.Version || a.Algorithm != b.Algorithm || len(a.Scales) != len(b.Scales) {
		return false
	}
	for k, v := range a.Scales {
		w, ok := b.Scales[k]
		if !ok || math.Float32bits(v) != math.Float32bits(w) {
			return false
		}
	}
	an, bn := slices.Clone(a.Names), slices.Clone(b.Names)
	slices.Sort(an)
	slices.Sort(bn)
	return slices.Equal(an, bn)
}

func TestCacheMarshalExact(t *testing.T) {
	c := NewCache(manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1}, map[string]float32{
		"output":                               0.5,
		"images":                               float32(1.0 / 127), // formats.md: 3c010204 = 1/127
		"(Unnamed Layer* 8) [Constant]_output": 1,
		"input_1:0":                            float32(2.0 / 127),
	})
	const want = "TRT-8601-EntropyCalibration2\n" +
		"(Unnamed Layer* 8) [Constant]_output: 3f800000\n" +
		"images: 3c010204\n" +
		"input_1:0: 3c810204\n" +
		"output: 3f000000\n"
	got, err := c.Marshal()
	if err != nil || string(got) != want {
		t.Fatalf("Marshal() = %q, %v, want %q", got, err, want)
	}
	path := filepath.Join(t.TempDir(), "model.cache")
	if err := WriteCacheFile(path, c); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCacheFile(path)
	if err != nil || !sameCache(c, back) {
		t.Fatalf("ReadCacheFile(WriteCacheFile(c)) = %+v, %v, want c", back, err)
	}
	if a, _ := back.Amax("input_1:0"); a != 2 {
		t.Errorf("Amax(input_1:0) = %v, want 2", a)
	}
	r := Ranges{Version: RangesVersion, Tensors: []TensorRange{
		{Tensor: "x", Method: Entropy, Amax: 1, Scale: 1.0 / 127},
	}}
	got, _ = r.Cache(manifest.TRTVersion{Major: 10, Minor: 3, Patch: 0}).Marshal()
	if want := "TRT-100300-EntropyCalibration2\nx: 3c010204\n"; string(got) != want {
		t.Errorf("Ranges.Cache(100300).Marshal() = %q, want %q", got, want)
	}
}

func TestParseCache(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]uint32
		version int
		algo    string
		err     string
	}{
		{"crlf and no final newline", "TRT-8600-EntropyCalibration2\r\na: 3c010204\r\nb c: 3F800000", map[string]uint32{"a": 0x3c010204, "b c": 0x3f800000}, 8600, EntropyCalibration2, ""},
		{"names with colons", "TRT-100300-EntropyCalibration2\ninput_1:0: 3c010204\nx:: 00000001\na: b: 3f000000\n", map[string]uint32{"input_1:0": 0x3c010204, "x:": 1, "a: b": 0x3f000000}, 100300, EntropyCalibration2, ""},
		{"empty lines skipped", "TRT-7000-MinMaxCalibration\n\na: 3c010204\n\n\n", map[string]uint32{"a": 0x3c010204}, 7000, "MinMaxCalibration", ""},
		{"header only", "TRT-8502-EntropyCalibration\n", map[string]uint32{}, 8502, "EntropyCalibration", ""},
		{"empty", "", nil, 0, "", "empty calibration cache"},
		{"no header", "images: 3c010204\n", nil, 0, "", `line 1: header "images: 3c010204" does not start with TRT-`},
		{"bad version", "TRT-86a0-EntropyCalibration2\n", nil, 0, "", "line 1: header"},
		{"no algorithm", "TRT-8600-\n", nil, 0, "", "line 1: header"},
		{"short hex", "TRT-8600-EntropyCalibration2\na: 3c010204\nb: 3c0102\n", nil, 0, "", `line 3: scale "3c0102" of tensor "b" is not 8 hex digits`},
		{"long hex", "TRT-8600-EntropyCalibration2\nb: 3c0102040\n", nil, 0, "", "line 2: scale"},
		{"0x prefix", "TRT-8600-EntropyCalibration2\nb: 0x3c0102\n", nil, 0, "", "line 2: scale"},
		{"trailing space", "TRT-8600-EntropyCalibration2\nb: 3c010204 \n", nil, 0, "", "line 2: scale"},
		{"decimal value", "TRT-8600-EntropyCalibration2\nb: 0.0078\n", nil, 0, "", "line 2: scale"},
		{"no separator", "TRT-8600-EntropyCalibration2\nb:3c010204\n", nil, 0, "", `line 2: "b:3c010204" has no ": "`},
		{"empty name", "TRT-8600-EntropyCalibration2\n: 3c010204\n", nil, 0, "", "line 2: \": 3c010204\" has an empty tensor name"},
		{"duplicate", "TRT-8600-EntropyCalibration2\na: 3c010204\na: 3c010204\n", nil, 0, "", `line 3: tensor "a" is already on line 2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCache([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseCache(%q) error = %v, want %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseCache(%q) error: %v", tt.in, err)
			}
			got := map[string]uint32{}
			for k, v := range c.Scales {
				got[k] = math.Float32bits(v)
			}
			if c.Version != tt.version || c.Algorithm != tt.algo || !mapsEqual(got, tt.want) {
				t.Errorf("ParseCache(%q) = %d %q %v, want %d %q %v", tt.in, c.Version, c.Algorithm, got, tt.version, tt.algo, tt.want)
			}
		})
	}
}

func TestCacheMarshalErrors(t *testing.T) {
	for _, c := range []Cache{
		{Version: 8600, Scales: map[string]float32{"": 1}},
		{Version: 8600, Scales: map[string]float32{"a\nb": 1}},
		{Version: 8600, Algorithm: "Entropy Calibration", Scales: map[string]float32{"a": 1}},
		{Version: -1, Scales: map[string]float32{"a": 1}},
	} {
		if _, err := c.Marshal(); err == nil {
			t.Errorf("Marshal(%+v) = nil error, want one", c)
		}
	}
}

func TestCheckCompatible(t *testing.T) {
	entropy := Cache{Version: 8600, Algorithm: EntropyCalibration2}
	tests := []struct {
		name   string
		c      Cache
		target manifest.TRTVersion
		want   string // "" for compatible
	}{
		{"same version", entropy, manifest.TRTVersion{Major: 8, Minor: 6}, ""},
		{"other patch", entropy, manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1}, "written for TensorRT 8.6.0"},
		{"8.6 cache on 10.3", entropy, manifest.TRTVersion{Major: 10, Minor: 3}, "TensorRT ignores a cache from another version"},
		{"minmax header", Cache{Version: 100300, Algorithm: "MinMaxCalibration"}, manifest.TRTVersion{Major: 10, Minor: 3}, "ignores a MinMaxCalibration cache"},
		{"TensorRT 11", Cache{Version: 110000, Algorithm: EntropyCalibration2}, manifest.TRTVersion{Major: 11}, "TensorRT 11 removed --int8 and --calib"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckCompatible(tt.c, tt.target)
			if tt.want == "" {
				if err != nil {
					t.Errorf("CheckCompatible(%d, %v) = %v, want nil", tt.c.Version, tt.target, err)
				}
				return
			}
			var ie *IncompatibleCacheError
			if !errors.As(err, &ie) || ie.TargetVersion != tt.target || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckCompatible(%d, %v) = %v, want *IncompatibleCacheError containing %q", tt.c.Version, tt.target, err, tt.want)
			}
		})
	}
}

// FuzzCalibrationCache: the reader never panics, and whatever it accepts is
// written and re-read unchanged.
func FuzzCalibrationCache(f *testing.F) {
	if entries, err := os.ReadDir(testutil.CorpusPath(f, "calib-caches")); err == nil {
		for _, e := range entries {
			if data, err := os.ReadFile(testutil.CorpusPath(f, "calib-caches", e.Name())); err == nil {
				f.Add(data)
			}
		}
	}
	f.Add([]byte("TRT-8600-EntropyCalibration2\r\na: 3c010204\r\nb c: 3F800000"))
	f.Add([]byte("TRT-100300-EntropyCalibration2\ninput_1:0: 3c010204\nx:: 7fc00000\n"))
	f.Add([]byte("TRT-1-X\n\n: 00000000\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCache(data)
		if err != nil {
			return
		}
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed cache: %v", err)
		}
		again, err := ParseCache(out)
		if err != nil {
			t.Fatalf("ParseCache(Marshal(c)) error: %v\n%q", err, out)
		}
		if !sameCache(c, again) {
			t.Fatalf("ParseCache(Marshal(c)) differs from c\n%q\n%q", data, out)
		}
		if out2, _ := again.Marshal(); !bytes.Equal(out, out2) {
			t.Fatalf("Marshal is not stable:\n%q\n%q", out, out2)
		}
	})
}
