package calibrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

// checkReadOutput verifies that ReadOutput reads back what Run wrote into
// out and reported as rep, and that report.json decodes into a Report that
// encodes to the same bytes.
func checkReadOutput(t *testing.T, out string, rep *Report) {
	t.Helper()
	got, err := ReadOutput(out)
	if err != nil {
		t.Fatalf("ReadOutput(%s): %v", out, err)
	}
	want := manifest.CalibrationOutput{
		Dir: out, QDQModel: filepath.Join(out, ModelFile), Model: rep.ModelDigest,
		Calibration:       manifest.Calibration{Method: string(rep.Method), Dataset: rep.DatasetDigest, Samples: rep.CalibrationSamples, Scope: string(rep.Scope)},
		ValidationSamples: rep.ValidationSamples,
	}
	if slices.Contains(rep.Files, CacheFile) { // only with Config.TRTCache
		want.Cache = filepath.Join(out, CacheFile)
	}
	if rep.Accuracy != nil {
		want.Calibration.Cosine, want.Calibration.Top1Agreement = rep.Accuracy.Outputs[0].Cosine, rep.Accuracy.Outputs[0].Top1
	}
	if !reflect.DeepEqual(got.Validation, rep.ValidationSplit) || (rep.ValidationSamples > 0) != (got.Validation != nil) {
		t.Errorf("ReadOutput(%s).Validation = %+v, want the report's split %+v", out, got.Validation, rep.ValidationSplit)
	} else if got.Validation != nil && len(got.Validation.Indices) != rep.ValidationSamples {
		t.Errorf("ReadOutput(%s).Validation has %d samples, want %d", out, len(got.Validation.Indices), rep.ValidationSamples)
	}
	got.Validation = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadOutput(%s) = %+v, want %+v", out, got, want)
	}
	if md, _, err := manifest.DigestFile(rep.Model); err != nil || got.Model != md {
		t.Errorf("ReadOutput(%s).Model = %s, want the model's digest %s (%v)", out, got.Model, md, err)
	}
	if err := errors.Join(got.Model.Validate(), got.Calibration.Dataset.Validate()); err != nil {
		t.Errorf("ReadOutput(%s) digests: %v", out, err)
	}
	js, err := os.ReadFile(filepath.Join(out, ReportJSON))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("report.json does not decode into a Report: %v", err)
	}
	if again, err := back.JSON(); err != nil || !bytes.Equal(again, js) {
		t.Errorf("report.json does not round-trip through Report (%v):\n--- written\n%s\n--- re-encoded\n%s", err, js, again)
	}
}

// fakeOutput writes the files of a calibration output into a new
// directory, except those named in omit, without running anything:
// ReadOutput only parses ranges.json and report.json.
func fakeOutput(t *testing.T, omit ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "calib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := &Report{
		ValidationSamples: 8, Method: Entropy,
		Accuracy: &Accuracy{Samples: 8, Outputs: []OutputAccuracy{{Output: "probs", Cosine: 0.995, Top1: 0.875}, {Output: "logits", Cosine: 0.5}}},
	}
	js, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{ModelFile: []byte("onnx"), CacheFile: []byte("TRT-100300-EntropyCalibration2\n"), ReportJSON: js}
	for name, data := range files {
		if !strings.Contains(strings.Join(omit, " "), name) {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(strings.Join(omit, " "), RangesFile) {
		if err := WriteRanges(filepath.Join(dir, RangesFile), sampleRanges()); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadOutput(t *testing.T) {
	full := manifest.CalibrationOutput{
		Model:             "sha256:aa",
		Calibration:       manifest.Calibration{Method: "entropy", Dataset: "sha256:bb", Samples: 64, Cosine: 0.995, Top1Agreement: 0.875},
		ValidationSamples: 8,
	}
	tests := []struct {
		name  string
		omit  []string
		want  func(dir string) manifest.CalibrationOutput
		isOut string // the OutputError's reason, when one is wanted
	}{
		{"every file", nil, func(dir string) manifest.CalibrationOutput {
			o := full
			o.Dir, o.QDQModel, o.Cache = dir, filepath.Join(dir, ModelFile), filepath.Join(dir, CacheFile)
			return o
		}, ""},
		{"no Q/DQ model", []string{ModelFile}, func(dir string) manifest.CalibrationOutput {
			o := full
			o.Dir, o.Cache = dir, filepath.Join(dir, CacheFile)
			return o
		}, ""},
		{"no cache", []string{CacheFile}, func(dir string) manifest.CalibrationOutput {
			o := full
			o.Dir, o.QDQModel = dir, filepath.Join(dir, ModelFile)
			return o
		}, ""},
		{"no report", []string{ReportJSON}, func(dir string) manifest.CalibrationOutput {
			return manifest.CalibrationOutput{
				Dir: dir, QDQModel: filepath.Join(dir, ModelFile), Cache: filepath.Join(dir, CacheFile), Model: "sha256:aa",
				Calibration: manifest.Calibration{Method: "entropy", Dataset: "sha256:bb", Samples: 64},
			}
		}, ""},
		{"neither model nor cache", []string{ModelFile, CacheFile}, nil, "neither model.int8.onnx nor calibration.cache"},
		{"no ranges", []string{RangesFile}, nil, "no ranges.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fakeOutput(t, tt.omit...)
			got, err := ReadOutput(dir)
			if tt.isOut != "" {
				var oe *OutputError
				if !errors.As(err, &oe) || oe.Dir != dir || !strings.Contains(err.Error(), tt.isOut) {
					t.Errorf("ReadOutput(%s) = %v, want an *OutputError for %s saying %q", tt.name, err, dir, tt.isOut)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want(dir)) {
				t.Errorf("ReadOutput(%s) = %+v, %v, want %+v", tt.name, got, err, tt.want(dir))
			}
		})
	}
}

func TestReadOutputErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	_, err := ReadOutput(missing)
	var oe *OutputError
	if !errors.As(err, &oe) || oe.Dir != missing || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadOutput(a missing directory) = %v, want an *OutputError that is fs.ErrNotExist", err)
	}
	file := filepath.Join(fakeOutput(t), RangesFile)
	if _, err := ReadOutput(file); !errors.As(err, &oe) || oe.Dir != file || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("ReadOutput(a file) = %v, want an *OutputError saying it is not a directory", err)
	}
	for _, name := range []string{RangesFile, ReportJSON} {
		for what, data := range map[string]string{"not json": "{", "wrong type": `{"method": 1}`} {
			dir := fakeOutput(t)
			path := filepath.Join(dir, name)
			if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadOutput(dir)
			if err == nil || errors.As(err, &oe) || !strings.Contains(err.Error(), path) {
				t.Errorf("ReadOutput(%s %s) = %v, want a parse error naming %s", what, name, err, path)
			}
		}
	}
	dir := fakeOutput(t)
	r := sampleRanges()
	r.Version = 2
	data, _ := json.Marshal(r)
	if err := os.WriteFile(filepath.Join(dir, RangesFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOutput(dir); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("ReadOutput(ranges version 2) = %v, want ReadRanges' validation error", err)
	}
}

// TestRunCached: a second RunCached of the same config reuses the first
// one's directory without touching it, as does the same config with its
// defaults written out; a changed field calibrates into another directory.
func TestRunCached(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	npy := writeNpy(t, dir, "images", 16, []int64{3, 32, 32}, 3)
	cache := filepath.Join(dir, "cache")
	cfg := Config{Model: filepath.Join(testutil.RepoRoot(t), "testdata", "tinynet.onnx"), Data: dataset.Spec{Path: npy}, Batch: 8}
	first, rep, err := RunCached(context.Background(), cfg, cache)
	if err != nil || rep == nil {
		t.Fatalf("RunCached = %v, %v, want a report", rep, err)
	}
	if filepath.Dir(first) != cache || len(filepath.Base(first)) != 16 {
		t.Errorf("RunCached dir = %s, want %s/<16 hex digits>", first, cache)
	}
	checkReadOutput(t, first, rep)
	before := snapshot(t, first)

	explicit := cfg
	explicit.Method, explicit.CalibShare, explicit.TRTVersion, explicit.Exclude = Entropy, 0.5, DefaultTRTVersion, []string{}
	for name, c := range map[string]Config{"same config": cfg, "defaults written out": explicit} {
		again, rep, err := RunCached(context.Background(), c, cache)
		if err != nil || again != first || rep != nil {
			t.Errorf("RunCached(%s) = %s, %v, %v, want %s, a nil report", name, again, rep, err, first)
		}
	}
	if after := snapshot(t, first); !mapsEqual(before, after) {
		t.Errorf("reusing %s changed its files", first)
	}

	other := cfg
	other.Method = MinMax
	second, rep, err := RunCached(context.Background(), other, cache)
	if err != nil || rep == nil || second == first || filepath.Dir(second) != cache {
		t.Fatalf("RunCached(minmax) = %s, %v, %v, want another directory of %s and a report", second, rep, err, cache)
	}
	if out, err := ReadOutput(second); err != nil || out.Calibration.Method != string(MinMax) {
		t.Errorf("ReadOutput(minmax run) = %+v, %v, want method minmax", out, err)
	}
}

// TestCacheKey: the key follows the model's content and the dataset's
// absolute path, not the spelling of either path.
func TestCacheKey(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.onnx")
	if err := os.WriteFile(model, []byte("model"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	key := func(c Config) manifest.Digest {
		t.Helper()
		k, err := cacheKey(c)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	base := Config{Model: model, Data: dataset.Spec{Path: filepath.Join(dir, "data")}}
	rel := base
	rel.Model, rel.Data.Path = "m.onnx", "data"
	if key(rel) != key(base) {
		t.Errorf("cacheKey with relative paths differs from absolute ones")
	}
	gcs := base
	gcs.Data.Path = "gs://bucket/data"
	if key(gcs) == key(base) {
		t.Errorf("cacheKey(gs://bucket/data) = cacheKey(%s)", base.Data.Path)
	}
	for name, change := range map[string]func(*Config){
		"samples":    func(c *Config) { c.Samples = 10 },
		"seed":       func(c *Config) { c.Seed = 2 },
		"percentile": func(c *Config) { c.MethodOptions.Percentile = 99.9 },
		"preprocess": func(c *Config) { c.Data.Preprocess.Scale = 2 },
		"exclude":    func(c *Config) { c.Exclude = []string{"Gemm"} },
		"tensorrt":   func(c *Config) { c.TRTVersion = manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1} },
	} {
		c := base
		change(&c)
		if key(c) == key(base) {
			t.Errorf("cacheKey ignores %s", name)
		}
	}
	before := key(base)
	if err := os.WriteFile(model, []byte("other model"), 0o644); err != nil {
		t.Fatal(err)
	}
	if key(base) == before {
		t.Errorf("cacheKey ignores the model's content")
	}
}

// snapshot records every file under dir with its content and modification
// time.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		files[p] = info.ModTime().Format(time.RFC3339Nano) + "\n" + string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
