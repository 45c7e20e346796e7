package calibrate

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// QDQTensors, the placement Quantize follows, lists exactly the
// activations Quantize quantizes when every tensor has a range, and the
// qdq scope observes those of them that Observed lists, in graph order.
func TestQDQTensorsArePlacement(t *testing.T) {
	initORT(t)
	for name, p := range map[string]*onnxpb.ModelProto{
		"classifier": testmodels.Classifier(1),
		"resnetish":  testmodels.ResNetish(8, 1),
	} {
		t.Run(name, func(t *testing.T) {
			m := &onnx.Model{Proto: p}
			all, err := observedIn(m, ScopeAll)
			if err != nil {
				t.Fatal(err)
			}
			// A range for every tensor, as a full-scope run gives.
			r := Ranges{Version: RangesVersion, Method: MinMax, Samples: 1}
			for _, n := range all {
				r.Tensors = append(r.Tensors, TensorRange{Tensor: n, Method: MinMax, Amax: 1, Scale: 1.0 / 127, Min: -1, Max: 1, Samples: 1})
			}
			q, err := Quantize(m, r, QuantizeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := QDQTensors(m, QuantizeOptions{}); !slices.Equal(got, q.Activations) {
				t.Errorf("QDQTensors = %v, Quantize quantized %v", got, q.Activations)
			}
			scope, err := observedIn(m, ScopeQDQ)
			if err != nil {
				t.Fatal(err)
			}
			want := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return !slices.Contains(q.Activations, n) })
			if !slices.Equal(scope, want) || len(scope) == 0 || len(scope) >= len(all) {
				t.Errorf("qdq scope = %v, want %v (a part of the %d observed)", scope, want, len(all))
			}
		})
	}
}

// scopeRun calibrates ResNetish (Relu pairs, residual Adds, a Gemm head)
// into dir with graph optimizations off, so that which tensors are
// fetched cannot change what ONNX Runtime computes.
func scopeRun(t *testing.T, model, npy, dir string, all bool) *Report {
	t.Helper()
	rep, err := Run(context.Background(), Config{
		Model: model, Method: Entropy, Data: dataset.Spec{Path: npy}, Seed: 1, Batch: 8,
		TRTCache: all, ORTTable: all, Session: ort.SessionOptions{OptLevel: ort.OptDisabled},
	}, dir)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// The default (qdq) scope writes the same Q/DQ model, byte for byte, as a
// run that observes every tensor, and the same ranges for the tensors it
// observes (histograms are per tensor); it writes no TensorRT cache and no
// ONNX Runtime table, and the report and ReadOutput say which scope ran.
func TestScopeQDQModelIdentical(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "resnetish.onnx", testmodels.ResNetish(8, 1))
	npy := writeNpy(t, dir, "images", 24, []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, 3)
	qdqDir, allDir := filepath.Join(dir, "qdq"), filepath.Join(dir, "all")
	qrep := scopeRun(t, model, npy, qdqDir, false)
	arep := scopeRun(t, model, npy, allDir, true)

	qm, err := os.ReadFile(filepath.Join(qdqDir, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	am, err := os.ReadFile(filepath.Join(allDir, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(qm, am) {
		t.Errorf("%s of the qdq scope (%d bytes) differs from the all scope's (%d bytes)", ModelFile, len(qm), len(am))
	}
	qr, err := ReadRanges(filepath.Join(qdqDir, RangesFile))
	if err != nil {
		t.Fatal(err)
	}
	ar, err := ReadRanges(filepath.Join(allDir, RangesFile))
	if err != nil {
		t.Fatal(err)
	}
	full := map[string]TensorRange{}
	for _, tr := range ar.Tensors {
		full[tr.Tensor] = tr
	}
	for _, tr := range qr.Tensors {
		if full[tr.Tensor] != tr {
			t.Errorf("range of %s: qdq scope %+v, all scope %+v", tr.Tensor, tr, full[tr.Tensor])
		}
	}
	if len(qr.Tensors) != len(qrep.Quantization.Activations) || len(qr.Tensors) >= len(ar.Tensors) || qr.DatasetDigest != ar.DatasetDigest {
		t.Errorf("qdq scope: %d ranges for %d activations, all scope %d ranges; digests %s, %s",
			len(qr.Tensors), len(qrep.Quantization.Activations), len(ar.Tensors), qr.DatasetDigest, ar.DatasetDigest)
	}

	if got, want := qrep.Files, []string{ModelFile, RangesFile, ReportJSON, ReportMD}; qrep.Scope != ScopeQDQ || !slices.Equal(got, want) {
		t.Errorf("qdq report: scope %q, files %v, want qdq, %v", qrep.Scope, got, want)
	}
	if got, want := arep.Files, []string{CacheFile, ModelFile, ORTDir + "/", RangesFile, ReportJSON, ReportMD}; arep.Scope != ScopeAll || !slices.Equal(got, want) {
		t.Errorf("all report: scope %q, files %v, want all, %v", arep.Scope, got, want)
	}
	for _, name := range []string{CacheFile, ORTDir} {
		if _, err := os.Stat(filepath.Join(qdqDir, name)); !os.IsNotExist(err) {
			t.Errorf("qdq scope wrote %s (%v)", name, err)
		}
	}
	if md, _ := os.ReadFile(filepath.Join(qdqDir, ReportMD)); !bytes.Contains(md, []byte("scope qdq")) {
		t.Errorf("%s does not say the scope:\n%s", ReportMD, md)
	}
	for dir, want := range map[string]Scope{qdqDir: ScopeQDQ, allDir: ScopeAll} {
		out, err := ReadOutput(dir)
		if err != nil {
			t.Fatal(err)
		}
		if out.Calibration.Scope != string(want) || (out.Cache == "") != (want == ScopeQDQ) || out.QDQModel == "" {
			t.Errorf("ReadOutput(%s) = scope %q, cache %q, Q/DQ model %q; want scope %s", dir, out.Calibration.Scope, out.Cache, out.QDQModel, want)
		}
	}
}

// With TRTCache the TensorRT cache is that of every observed tensor, byte
// for byte the cache Run wrote before scopes (Collect over every tensor,
// ranges, Cache), and it parses.
func TestTRTCacheEveryTensor(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "resnetish.onnx", testmodels.ResNetish(8, 1))
	npy := writeNpy(t, dir, "images", 24, []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, 3)
	out := filepath.Join(dir, "out")
	rep, err := Run(context.Background(), Config{Model: model, Data: dataset.Spec{Path: npy}, Seed: 1, TRTCache: true}, out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(out, CacheFile))
	if err != nil {
		t.Fatal(err)
	}

	// The old way: every tensor of the model Run calibrates observed, on
	// the calibration samples Run drew.
	_, m, err := loadModel(context.Background(), model, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := dataset.Open(context.Background(), dataset.Spec{Path: npy, Inputs: m.Inputs()}, dataset.Local{})
	if err != nil {
		t.Fatal(err)
	}
	calib, _, err := dataset.Split(dataset.Select(0, src.Len(), 1), 0.5)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Collect(context.Background(), m, dataset.Batches(context.Background(), src, calib, dataset.BatchOptions{Size: DefaultBatch, Inputs: m.Inputs()}), CollectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.Ranges(Entropy, MethodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := r.Cache(DefaultTRTVersion).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s with TRTCache differs from the every-tensor cache:\n%s\nwant\n%s", CacheFile, got, want)
	}
	c, err := ReadCacheFile(filepath.Join(out, CacheFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Scales) != rep.TensorRanges || rep.Scope != ScopeAll {
		t.Errorf("cache holds %d scales, report %d ranges in scope %q, want equal, all", len(c.Scales), rep.TensorRanges, rep.Scope)
	}
}

// --validation -1: every drawn sample calibrates, none is set aside, and
// there is no accuracy report.
func TestValidationNone(t *testing.T) {
	initORT(t)
	dir := t.TempDir()
	model := writeModel(t, dir, "resnetish.onnx", testmodels.ResNetish(8, 1))
	npy := writeNpy(t, dir, "images", 20, []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, 3)
	rep, err := Run(context.Background(), Config{Model: model, Data: dataset.Spec{Path: npy}, Validation: -1, CalibShare: 0.25}, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.CalibrationSamples != 20 || rep.ValidationSamples != 0 || rep.Accuracy != nil || rep.ValidationSplit != nil {
		t.Errorf("Run(--validation -1) = %d calibration, %d validation samples, accuracy %v, split %v; want 20, 0, none, none",
			rep.CalibrationSamples, rep.ValidationSamples, rep.Accuracy != nil, rep.ValidationSplit)
	}
}
