package serve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// repository is what serve reads of a model repository: its models as
// artifacts, kiln's manifest (nil when there is none) and the lint result.
type repository struct {
	dir       string
	manifest  *manifest.Manifest
	artifacts []Artifact
	problems  map[string]pbtxt.Problems // by model name; "" for the repository
	// unbuilt are the models kiln.json lists that have no directory:
	// TensorRT variants convert could not build here (needs-gpu).
	unbuilt []*manifest.Model
}

// readRepository lists the artifacts of dir that Triton would load (the
// newest version of each model) and lints every config against its model
// (pbtxt.LintRepository: names, types, dims, max_batch_size, plans' profiles).
func readRepository(dir string, only []string) (*repository, error) {
	repo, err := pbtxt.ReadRepository(dir)
	if err != nil {
		return nil, err
	}
	r := &repository{dir: dir, problems: map[string]pbtxt.Problems{}}
	if m, err := manifest.Read(filepath.Join(dir, manifest.FileName)); err == nil {
		r.manifest = m
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	probs, err := pbtxt.LintRepository(dir, pbtxt.LintOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range probs {
		name := modelOfProblem(dir, p.File)
		r.problems[name] = append(r.problems[name], p)
	}
	for _, m := range repo.Models {
		if len(only) > 0 && !slices.Contains(only, m.Name) {
			continue
		}
		a, ok := artifactOf(m, r.manifest)
		if ok {
			r.artifacts = append(r.artifacts, a)
		}
	}
	if r.manifest != nil {
		for _, rec := range r.manifest.Models {
			if repo.Model(rec.Name) == nil && (len(only) == 0 || slices.Contains(only, rec.Name)) {
				r.unbuilt = append(r.unbuilt, rec)
			}
		}
	}
	for _, name := range only {
		if repo.Model(name) == nil && (r.manifest == nil || r.manifest.Model(name) == nil) {
			return nil, fmt.Errorf("repository %s has no model %q", dir, name)
		}
	}
	if len(r.artifacts) == 0 && len(r.unbuilt) == 0 {
		return nil, fmt.Errorf("repository %s has no model Triton would load", dir)
	}
	return r, nil
}

// artifactOf describes the newest loaded version of m; ensembles and
// models without a loadable version are skipped.
func artifactOf(m *pbtxt.Model, man *manifest.Manifest) (Artifact, bool) {
	file := pbtxt.DefaultModelFilename(m.Config)
	if file == "" || len(m.Loaded) == 0 {
		return Artifact{}, false
	}
	v := m.Loaded[len(m.Loaded)-1]
	a := Artifact{
		Name: m.Name, Version: v, Platform: platformOf(m),
		Path:     filepath.Join(m.Dir, strconv.FormatInt(v, 10), file),
		MaxBatch: int(m.Config.GetMaxBatchSize()),
	}
	if st, err := os.Stat(a.Path); err == nil {
		a.Size = st.Size()
	}
	if db := m.Config.GetDynamicBatching(); db != nil {
		a.MaxQueueDelay = time.Duration(db.GetMaxQueueDelayMicroseconds()) * time.Microsecond
		for _, b := range db.GetPreferredBatchSize() {
			a.PreferredBatch = append(a.PreferredBatch, int(b))
		}
	}
	for _, g := range m.Config.GetInstanceGroup() {
		a.Instances += max(int(g.GetCount()), 1)
	}
	if man != nil {
		if rec := man.Model(m.Name); rec != nil {
			a.Variant, a.Source = rec.Variant, rec.Source
			sig := pbtxt.SignatureFromManifest(rec)
			a.Inputs, a.Outputs = valueInfos(sig.Inputs, a.MaxBatch), valueInfos(sig.Outputs, a.MaxBatch)
		}
	}
	if a.Variant.Precision == "" {
		a.Variant.Precision = manifest.FP32
	}
	if a.Variant.Runtime == "" {
		a.Variant.Runtime = manifest.RuntimeONNX
		if a.Platform == pbtxt.PlatformTensorRT {
			a.Variant.Runtime = manifest.RuntimeTRT
		}
	}
	return a, true
}

// platformOf is the config's platform, or the one its backend implies.
func platformOf(m *pbtxt.Model) string {
	if p := m.Config.GetPlatform(); p != "" {
		return p
	}
	switch pbtxt.BackendOf(m.Config) {
	case "tensorrt":
		return pbtxt.PlatformTensorRT
	case "onnxruntime":
		return pbtxt.PlatformONNX
	}
	return m.Config.GetBackend()
}

// valueInfos converts recorded tensors to value infos; kiln.json records
// full shapes (batch dimension included, -1 where dynamic).
func valueInfos(ts []pbtxt.TensorSig, _ int) []onnx.ValueInfo {
	out := make([]onnx.ValueInfo, len(ts))
	for i, t := range ts {
		v := onnx.ValueInfo{Name: t.Name, Kind: "tensor", Type: onnxType(t.DataType), Shape: onnx.Shape{Ranked: !t.Unranked}}
		for _, d := range t.Shape {
			if d >= 0 {
				v.Shape.Dims = append(v.Shape.Dims, onnx.Dim{Value: d, Known: true})
			} else {
				v.Shape.Dims = append(v.Shape.Dims, onnx.Dim{})
			}
		}
		out[i] = v
	}
	return out
}

// modelOfProblem names the model directory a lint problem's file is in.
func modelOfProblem(dir, file string) string {
	rel, err := filepath.Rel(dir, file)
	if err != nil || file == "" {
		return ""
	}
	first, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
	if first == "." || first == ".." {
		return ""
	}
	return first
}

// onnxType is the ONNX element type of a Triton data type.
func onnxType(dt configpb.DataType) onnx.DataType {
	for t := onnx.Float; t <= onnx.Uint4+8; t++ {
		if pbtxt.DataTypeOf(t) == dt && dt != configpb.DataType_TYPE_INVALID {
			return t
		}
	}
	return onnx.Undefined
}
