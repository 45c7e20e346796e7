package savedmodel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
)

// corpusModels are the corpus SavedModels that must open, with the version
// Open picks.
var corpusModels = map[string]int64{
	"tf-serving/saved_model_half_plus_two_cpu":                           123,
	"tf-serving/saved_model_half_plus_two_gpu_trt":                       123,
	"tf-serving/saved_model_half_plus_two_tf2_cpu":                       123,
	"tf-serving/saved_model_half_plus_three":                             123,
	"tf-serving/saved_model_counter":                                     123,
	"tf-serving/saved_model_half_plus_two_2_versions":                    124,
	"tf-serving/matrix_half_plus_two":                                    1,
	"tf-serving/saved_model_half_plus_two_2_versions/00000123":           NoVersion,
	"model-navigator/jax_linear/tf-savedmodel/model.savedmodel":          NoVersion,
	"model-navigator/tensorflow_identity/tf-savedmodel/model.savedmodel": NoVersion,
	"real/basic-pitch-nmp":                                               NoVersion,
	"real/mlperf-tiny-kws-dscnn":                                         NoVersion,
	"real/tf1-regression-tf2onnx":                                        NoVersion,
}

// Every SavedModel in the corpus opens, with its serve graph, its
// signatures and every variable decoded with its checksum verified.
func TestOpenCorpus(t *testing.T) {
	ctx := context.Background()
	root := testutil.Corpus(t, "savedmodel")
	for rel, version := range corpusModels {
		t.Run(rel, func(t *testing.T) {
			m, err := Open(ctx, filepath.Join(root, rel), nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.Version != version {
				t.Errorf("Open(%s).Version = %d, want %d", rel, m.Version, version)
			}
			sigs, err := m.Signatures("")
			if err != nil || len(sigs) == 0 {
				t.Fatalf("Signatures(serve) = %d signatures, %v", len(sigs), err)
			}
			if !slices.ContainsFunc(sigs, func(s Signature) bool { return s.Key == "serving_default" }) && !strings.Contains(rel, "counter") {
				t.Errorf("no serving_default signature in %v", sigs)
			}
			b, err := m.Bundle(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range b.Keys() {
				if _, err := b.Tensor(ctx, k); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// Open rejects the legacy export without saved_model.pb, saying so.
func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	root := testutil.Corpus(t, "savedmodel")
	empty := t.TempDir()
	cases := []struct {
		path string
		want []string
	}{
		{filepath.Join(root, "tf-serving", "bad_half_plus_two"), []string{"no saved_model.pb", "00000123", "export.meta"}},
		{empty, []string{"no saved_model.pb", "no numeric version directory"}},
	}
	for _, c := range cases {
		_, err := Open(ctx, c.path, nil)
		if !errors.Is(err, ErrNoSavedModel) {
			t.Fatalf("Open(%s) = %v, want ErrNoSavedModel", c.path, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open(%s) = %q, want it to mention %q", c.path, err, w)
			}
		}
	}
	if _, err := Open(ctx, filepath.Join(empty, "missing"), nil); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Open(missing) = %v, want an error naming it", err)
	}
	garbage := filepath.Join(t.TempDir(), "m")
	os.MkdirAll(garbage, 0o755)
	os.WriteFile(filepath.Join(garbage, ModelFile), []byte("\xff\xff\xff"), 0o644)
	if _, err := Open(ctx, garbage, nil); err == nil || !strings.Contains(err.Error(), ModelFile) {
		t.Errorf("Open(garbage) = %v, want a parse error naming %s", err, ModelFile)
	}
}

// Versions are compared as numbers, as TensorFlow Serving does, and
// non-numeric directories are not versions.
func TestLatestVersion(t *testing.T) {
	files := map[string]bool{"9/saved_model.pb": true, "10/saved_model.pb": true, "0011/x": true, "tmp/saved_model.pb": true, "-3/a": true}
	v, dir, err := latestVersion("base", files)
	if err != nil || v != 11 || dir != "0011" {
		t.Errorf("latestVersion = %d, %q, %v, want 11, 0011", v, dir, err)
	}
}

// metadataSignatures reads TensorFlow Serving's GetModelMetadata answer,
// the reference for what the signatures are.
func metadataSignatures(t *testing.T, path string) []Signature {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type info struct {
		DType string `json:"dtype"`
		Name  string `json:"name"`
		Shape struct {
			Dim []struct {
				Size string `json:"size"`
			} `json:"dim"`
			UnknownRank bool `json:"unknown_rank"`
		} `json:"tensor_shape"`
	}
	var md struct {
		Metadata struct {
			SignatureDef struct {
				SignatureDef map[string]struct {
					Inputs  map[string]info `json:"inputs"`
					Outputs map[string]info `json:"outputs"`
					Method  string          `json:"method_name"`
				} `json:"signature_def"`
			} `json:"signature_def"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &md); err != nil {
		t.Fatal(err)
	}
	specs := func(m map[string]info) []TensorSpec {
		out := []TensorSpec{}
		for k, i := range m {
			s := TensorSpec{Key: k, Name: i.Name, DType: i.DType, UnknownRank: i.Shape.UnknownRank}
			if !i.Shape.UnknownRank {
				s.Shape = []int64{}
				for _, d := range i.Shape.Dim {
					n, _ := strconv.ParseInt(d.Size, 10, 64)
					s.Shape = append(s.Shape, n)
				}
			}
			out = append(out, s)
		}
		slices.SortFunc(out, func(a, b TensorSpec) int { return strings.Compare(a.Key, b.Key) })
		return out
	}
	var out []Signature
	for k, sd := range md.Metadata.SignatureDef.SignatureDef {
		out = append(out, Signature{Key: k, Method: sd.Method, Inputs: specs(sd.Inputs), Outputs: specs(sd.Outputs)})
	}
	slices.SortFunc(out, func(a, b Signature) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// The signatures match what TensorFlow Serving reports for the same models.
func TestSignaturesMatchServing(t *testing.T) {
	ctx := context.Background()
	root := testutil.Corpus(t, "savedmodel", "tf-serving")
	cases := map[string]string{
		"saved_model_half_plus_two_cpu":        "half_plus_two_model_metadata.json",
		"saved_model_half_plus_two_2_versions": "saved_model_half_plus_two_2_versions_metadata.json",
	}
	for model, md := range cases {
		m, err := Open(ctx, filepath.Join(root, model), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.Signatures("serve")
		if err != nil {
			t.Fatal(err)
		}
		want := metadataSignatures(t, filepath.Join(root, md))
		for i := range got {
			got[i].Def = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s signatures = %+v\nwant %+v", model, got, want)
		}
	}
}

func TestMetaGraphTags(t *testing.T) {
	m, err := Open(context.Background(), testutil.Corpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_cpu"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if mg, err := m.MetaGraph(" serve, serve"); err != nil || mg == nil {
		t.Errorf("MetaGraph(serve) = %v", err)
	}
	if _, err := m.MetaGraph("serve,gpu"); err == nil || !strings.Contains(err.Error(), `"serve"`) {
		t.Errorf("MetaGraph(serve,gpu) = %v, want an error listing the tag sets", err)
	}
}

// A model under gs:// opens through dataset's GCS backend, version chosen
// from the object listing, variables read with range reads.
func TestOpenGCS(t *testing.T) {
	ctx := context.Background()
	root := testutil.Corpus(t, "savedmodel", "tf-serving", "saved_model_half_plus_two_2_versions")
	var objects []fakestorage.Object
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		objects = append(objects, fakestorage.Object{
			ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "b", Name: "models/hp2/" + filepath.ToSlash(rel)},
			Content:     b,
		})
		return nil
	})
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true, InitialObjects: objects})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	gcs := dataset.NewGCSWithClient(srv.Client())
	defer gcs.Close()
	m, err := Open(ctx, "gs://b/models/hp2/", gcs)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 124 || m.Dir != "gs://b/models/hp2/00000124" {
		t.Errorf("Open(gs://b/models/hp2/) = version %d in %s, want 124 in gs://b/models/hp2/00000124", m.Version, m.Dir)
	}
	b, err := m.Bundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tt, err := b.Tensor(ctx, "b")
	if err != nil || tt.Data.([]float32)[0] != 2 {
		t.Errorf("Tensor(b) = %v, %v, want 2", tt, err)
	}
	if _, err := Open(ctx, "gs://b/models/none", gcs); err == nil || !strings.Contains(err.Error(), "gs://b/models/none") {
		t.Errorf("Open(gs://b/models/none) = %v, want an error naming it", err)
	}
}
