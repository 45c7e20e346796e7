package cmd

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
)

// convert and calibrate take a SavedModel directly: a TF Serving base
// directory is imported (its highest version), converted, and the variants
// pass kiln serve; a rerun reuses the import, so the source digest holds.
func TestConvertSavedModel(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := testutil.Corpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_tf2_cpu")
	repo := filepath.Join(t.TempDir(), "repo")
	for range 2 {
		if out, errOut, code := run(t, "convert", src, "--repo", repo, "--precision", "fp32,fp16", "--progress", "none"); code != 0 {
			t.Fatalf("convert SavedModel = exit %d\n%s\n%s", code, out, errOut)
		}
	}
	man, err := manifest.Read(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Sources) != 1 || man.Model("saved_model_half_plus_two_tf2_cpu_onnx_fp32") == nil {
		t.Fatalf("kiln.json sources %+v, models %d; want one source and the fp32 variant named for the SavedModel", man.Sources, len(man.Models))
	}
	// kiln.json says where the ONNX came from and how the signature's
	// names map to its graph.
	imp := man.Sources[0].Imported
	if imp == nil || imp.From != src || imp.Version != 123 || imp.Signature != "serving_default" ||
		len(imp.Inputs) != 1 || imp.Inputs[0].Key != "x" || imp.Inputs[0].ONNX == "" || len(imp.Outputs) != 1 {
		t.Errorf("kiln.json import record = %+v, want version 123's serving_default, x -> its ONNX input", imp)
	}
	if out, errOut, code := run(t, "serve", repo, "--perf=false"); code != 0 {
		t.Errorf("serve = exit %d\n%s\n%s", code, out, errOut)
	}
}

// The keyword-spotting CNN (mlperf tiny) calibrates from its SavedModel.
func TestCalibrateSavedModel(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := testutil.Corpus(t, "savedmodel", "real", "mlperf-tiny-kws-dscnn")
	data := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 16 {
		v := make([]float32, 49*10)
		for j := range v {
			v[j] = float32(rng.NormFloat64())
		}
		f, err := os.Create(filepath.Join(data, strings.Repeat("s", i+1)+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		if err := dataset.WriteNpy(f, &onnx.Tensor{Type: onnx.Float, Dims: []int64{49, 10, 1}, Data: v}); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	out := filepath.Join(t.TempDir(), "calib")
	if stdout, errOut, code := run(t, "calibrate", src, "--data", data, "-o", out, "--progress", "none"); code != 0 {
		t.Fatalf("calibrate SavedModel = exit %d\n%s\n%s", code, stdout, errOut)
	}
	if _, err := os.Stat(filepath.Join(out, "model.int8.onnx")); err != nil {
		t.Errorf("calibrate wrote no Q/DQ model: %v", err)
	}
}
