package pbtxt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

func TestVersionsToLoad(t *testing.T) {
	latest := func(n uint32) *configpb.ModelVersionPolicy {
		return &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_Latest_{Latest: &configpb.ModelVersionPolicy_Latest{NumVersions: n}}}
	}
	all := &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_All_{All: &configpb.ModelVersionPolicy_All{}}}
	specific := &configpb.ModelVersionPolicy{PolicyChoice: &configpb.ModelVersionPolicy_Specific_{Specific: &configpb.ModelVersionPolicy_Specific{Versions: []int64{1, 7}}}}
	avail := []int64{3, 1, 10, 2}
	for _, tc := range []struct {
		name   string
		policy *configpb.ModelVersionPolicy
		want   string
	}{
		{"default", nil, "10"},
		{"latest 2", latest(2), "3, 10"},
		{"latest more than present", latest(9), "1, 2, 3, 10"},
		{"all", all, "1, 2, 3, 10"},
		{"specific", specific, "1"},
	} {
		if got := versionList(VersionsToLoad(tc.policy, avail)); got != tc.want {
			t.Errorf("VersionsToLoad(%s, %v) = %s, want %s", tc.name, avail, got, tc.want)
		}
	}
	for name, want := range map[string]bool{"1": true, "0": true, "12": true, "01": false, "v1": false, "": false, "1a": false, "99999999999999999999": false} {
		if _, ok := ParseVersion(name); ok != want {
			t.Errorf("ParseVersion(%q) ok = %v, want %v", name, ok, want)
		}
	}
}

func TestWriteModelAndLint(t *testing.T) {
	repo := t.TempDir()
	src := filepath.Join(t.TempDir(), "model.onnx")
	writeONNX(t, src, classifierIO.ins, classifierIO.outs)
	sig, err := LoadSignature(src)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Generate(sig, GenerateOptions{Name: "cls", LabelsFile: "labels.txt", AllVersions: true})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string][]byte{"labels.txt": []byte("cat\ndog\n")}
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: src, Labels: labels}); err != nil {
		t.Fatalf("WriteModel = %v", err)
	}
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: src, Labels: labels, Version: 2}); err != nil {
		t.Fatalf("WriteModel(version 2) = %v", err)
	}
	r, err := ReadRepository(repo)
	if err != nil {
		t.Fatal(err)
	}
	m := r.Model("cls")
	if m == nil || versionList(m.Versions) != "1, 2" || versionList(m.Loaded) != "1, 2" || !proto.Equal(m.Config, c) {
		t.Fatalf("ReadRepository = %+v, want model cls with versions 1, 2 loaded and the written config", m)
	}
	ps, err := LintRepository(repo, LintOptions{})
	if err != nil || len(ps) != 0 {
		t.Errorf("LintRepository(written repo) = %v, %v; want no problems", ps, err)
	}
	var listing []string
	filepath.Walk(repo, func(p string, info os.FileInfo, err error) error {
		rel, _ := filepath.Rel(repo, p)
		listing = append(listing, rel)
		return nil
	})
	testutil.Golden(t, "listing", []byte(strings.Join(listing, "\n")+"\n"))
}

func TestWriteModelInterrupted(t *testing.T) {
	repo := t.TempDir()
	src := filepath.Join(t.TempDir(), "model.onnx")
	writeONNX(t, src, classifierIO.ins, classifierIO.outs)
	c := &configpb.ModelConfig{Name: "m", Platform: PlatformONNX}
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: src}); err != nil {
		t.Fatal(err)
	}
	// A write that dies between its two renames leaves the old directory
	// moved aside and a temporary one behind.
	if err := os.Rename(filepath.Join(repo, "m"), filepath.Join(repo, ".m.kiln-old")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(repo, ".m.kiln-tmp-123", "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := ReadRepository(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Models) != 1 || r.Models[0].Name != "m" || versionList(r.Models[0].Versions) != "1" {
		t.Fatalf("ReadRepository after an interrupted write = %+v, want the previous model m restored", r.Models)
	}
	if entries, _ := os.ReadDir(repo); len(entries) != 2 {
		t.Errorf("ReadRepository changed the repository: %d entries, want the 2 left by the interruption", len(entries))
	}
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: src, Version: 3}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(repo)
	if m, err := ReadModel(filepath.Join(repo, "m")); len(entries) != 1 || err != nil || versionList(m.Versions) != "1, 3" {
		t.Errorf("after the next WriteModel: %d entries, versions %v, %v; want only m with versions 1, 3", len(entries), m.Versions, err)
	}
	// A failing write (missing model file) leaves the previous model intact.
	if err := WriteModel(repo, WriteSpec{Config: c, ModelPath: filepath.Join(repo, "missing.onnx"), Version: 2}); err == nil {
		t.Fatal("WriteModel with a missing model file succeeded")
	}
	if m, err := ReadModel(filepath.Join(repo, "m")); err != nil || versionList(m.Versions) != "1, 3" {
		t.Errorf("after a failed write the model has versions %v (%v), want 1, 3", m.Versions, err)
	}
}

func TestLintRepositoryProblems(t *testing.T) {
	repo := t.TempDir()
	mk := func(model, config string, versions map[string][]tensor) {
		dir := filepath.Join(repo, model)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if config != "" {
			if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for v, outs := range versions {
			if err := os.MkdirAll(filepath.Join(dir, v), 0o755); err != nil {
				t.Fatal(err)
			}
			if outs != nil {
				writeONNX(t, filepath.Join(dir, v, "model.onnx"), []tensor{{"x", onnx.Float, []int64{-1, 4}}}, outs)
			}
		}
	}
	good := []tensor{{"y", onnx.Float, []int64{-1, 4}}}
	mk("typed", `platform: "onnxruntime_onnx" max_batch_size: 4 input [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "l.txt" } ]`, map[string][]tensor{"1": good})
	mk("zeros", `name: "zeros" backend: "onnxruntime"`, map[string][]tensor{"01": good})
	mk("wrongfile", `platform: "onnxruntime_onnx" default_model_filename: "net.onnx"`, map[string][]tensor{"1": good})
	mk("nocfg", "", map[string][]tensor{"3": good})
	mk("syntax", "name: \"syntax\"\ninput [ { name: x } ]\n", map[string][]tensor{"1": good})
	mk("specific", `backend: "onnxruntime" version_policy { specific { versions: [ 4 ] } }`, map[string][]tensor{"1": good})
	ps, err := LintRepository(repo, LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model, path string
		sev         Severity
		keywords    []string
	}{
		{"typed", "input[0].data_type", SeverityError, []string{"unexpected datatype TYPE_INT32 for inference input 'x', expecting TYPE_FP32"}},
		{"typed", "output[0].dims", SeverityError, []string{"the model expects 2 dimensions (shape [-1,4])", "set dims: [4]"}},
		{"typed", "output[0].label_filename", SeverityError, []string{"label file l.txt does not exist"}},
		{"zeros", "", SeverityWarning, []string{`directory "01" is ignored`, `rename it to "1"`}},
		{"zeros", "", SeverityError, []string{"has no version directory"}},
		{"wrongfile", "default_model_filename", SeverityError, []string{"version 1 has no net.onnx", "model.onnx"}},
		{"nocfg", "", SeverityWarning, []string{"no config.pbtxt"}},
		{"nocfg", "platform", SeverityWarning, []string{`Triton infers platform: "onnxruntime_onnx"`}},
		{"syntax", "", SeverityError, []string{"syntax error at line 2, column 17", "expected a quoted string"}},
		{"specific", "version_policy.specific.versions[0]", SeverityError, []string{"version 4 is requested but there is no directory"}},
		{"specific", "version_policy", SeverityError, []string{"selects none of the versions present (1)"}},
	} {
		found := false
		for _, p := range ps {
			if filepath.Base(p.File) != tc.model && !strings.Contains(p.File, "/"+tc.model+"/") || p.Path != tc.path || p.Severity != tc.sev {
				continue
			}
			ok := true
			for _, k := range tc.keywords {
				ok = ok && strings.Contains(p.Message, k)
			}
			found = found || ok
		}
		if !found {
			t.Errorf("LintRepository: no %s for %s at %q containing %q; got\n%s", tc.sev, tc.model, tc.path, tc.keywords, problemList(ps))
		}
	}
	for _, p := range ps {
		if strings.Contains(p.File, "nocfg") && p.Severity == SeverityError {
			t.Errorf("model without config but with an autofillable ONNX file: unexpected %v", p)
		}
	}
}

func TestLintDocsRepository(t *testing.T) {
	root := testutil.Corpus(t, "triton-configs", "docs_model_repository")
	for _, model := range []string{"simple", "simple_int8", "simple_string", "simple_sequence", "simple_dyna_sequence"} {
		ps, err := LintPath(filepath.Join(root, model), LintOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 0 {
			t.Errorf("LintPath(docs_model_repository/%s) =\n%s\nwant no problems (config matches model.onnx)", model, problemList(ps))
		}
	}
	ps, err := LintPath(filepath.Join(root, "densenet_onnx"), LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasProblem(ps, "", "has no version directory") {
		t.Errorf("LintPath(densenet_onnx) = %v, want the missing model reported", ps)
	}
}
