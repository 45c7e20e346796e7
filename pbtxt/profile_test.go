package pbtxt

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

func TestParseShapeSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ShapeSpec
		out  string
	}{
		{"", nil, ""},
		{"input0:1x3x256x256,input1:1x3x128x128", ShapeSpec{{"input0", []int64{1, 3, 256, 256}}, {"input1", []int64{1, 3, 128, 128}}}, "input0:1x3x256x256,input1:1x3x128x128"},
		{"'input:0':1x3x224x224", ShapeSpec{{"input:0", []int64{1, 3, 224, 224}}}, "'input:0':1x3x224x224"},
		{"x:0:4x1x28x28", ShapeSpec{{"x:0", []int64{4, 1, 28, 28}}}, "'x:0':4x1x28x28"},
		{"in0:scalar,in1:", ShapeSpec{{"in0", nil}, {"in1", nil}}, "in0:scalar,in1:scalar"},
		{"input*:8x3", ShapeSpec{{"input*", []int64{8, 3}}}, "input*:8x3"},
		{"x:0x7", ShapeSpec{{"x", []int64{0, 7}}}, "x:0x7"},
	} {
		got, err := ParseShapeSpec(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseShapeSpec(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
			continue
		}
		if s := got.String(); s != tc.out {
			t.Errorf("ParseShapeSpec(%q).String() = %q, want %q", tc.in, s, tc.out)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"x", "want name:dims"},
		{":1x3", "the input name is empty"},
		{"x:1x-3", `dimension "-3" is not a size`},
		{"x:1xx3", `dimension "" is not a size`},
		{"x:1x3,", "want name:dims"},
		{"x:1,x:2", `input "x" is already given`},
		{"a*b*:1", "at most one '*'"},
		{"'x:0:1", "no closing quote"},
		{"a'x':1", "a quoted name must start the entry"},
		{"'x'1", "want ':' after the quoted name"},
		{"'x':'1", "too many quotes"},
		{"x:99999999999999999999", "is not a size"},
	} {
		if _, err := ParseShapeSpec(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseShapeSpec(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestProfilesFromCommand(t *testing.T) {
	ins := []TensorSig{tsig("x", f32, -1, 3, 224, 224), tsig("mask", i32, 1, 10)}
	trt := func(args ...string) []string {
		return append([]string{"/usr/bin/trtexec", "--onnx=model.onnx", "--saveEngine=model.plan"}, append(args, "--fp16")...)
	}
	pi := func(name string, lo, opt, hi []int64) ProfileInput {
		return ProfileInput{Name: name, Min: lo, Opt: opt, Max: hi}
	}
	mask := pi("mask", []int64{1, 10}, []int64{1, 10}, []int64{1, 10})
	for _, tc := range []struct {
		name string
		argv []string
		ins  []TensorSig
		want []Profile
	}{
		{"kiln's build", trt("--minShapes=x:1x3x224x224", "--optShapes=x:4x3x224x224", "--maxShapes=x:8x3x224x224"), ins,
			[]Profile{{Inputs: []ProfileInput{pi("x", []int64{1, 3, 224, 224}, []int64{4, 3, 224, 224}, []int64{8, 3, 224, 224}), mask}}}},
		{"only opt", trt("--optShapes=x:4x3x224x224"), ins,
			[]Profile{{Inputs: []ProfileInput{pi("x", []int64{4, 3, 224, 224}, []int64{4, 3, 224, 224}, []int64{4, 3, 224, 224}), mask}}}},
		{"static", trt(), ins,
			[]Profile{{Inputs: []ProfileInput{pi("x", []int64{1, 3, 224, 224}, []int64{1, 3, 224, 224}, []int64{1, 3, 224, 224}), mask}}}},
		{"quoted names", trt("--minShapes='x:0':1x2", "--optShapes='x:0':2x2", "--maxShapes='x:0':4x2"), []TensorSig{tsig("x:0", f32, -1, 2)},
			[]Profile{{Inputs: []ProfileInput{pi("x:0", []int64{1, 2}, []int64{2, 2}, []int64{4, 2})}}}},
		{"wildcard", trt("--minShapes=in*:1x2,in1:1x5", "--optShapes=in*:2x2,in1:2x5", "--maxShapes=in*:3x2,in1:3x5"), []TensorSig{tsig("in0", f32, -1, 2), tsig("in1", f32, -1, 5)},
			[]Profile{{Inputs: []ProfileInput{pi("in0", []int64{1, 2}, []int64{2, 2}, []int64{3, 2}), pi("in1", []int64{1, 5}, []int64{2, 5}, []int64{3, 5})}}}},
		{"two profiles", trt("--profile=0", "--minShapes=x:1x3x224x224", "--optShapes=x:2x3x224x224", "--maxShapes=x:4x3x224x224",
			"--profile=1", "--minShapes=x:8x3x224x224", "--optShapes=x:16x3x224x224", "--maxShapes=x:32x3x224x224"), ins,
			[]Profile{
				{Inputs: []ProfileInput{pi("x", []int64{1, 3, 224, 224}, []int64{2, 3, 224, 224}, []int64{4, 3, 224, 224}), mask}},
				{Inputs: []ProfileInput{pi("x", []int64{8, 3, 224, 224}, []int64{16, 3, 224, 224}, []int64{32, 3, 224, 224}), mask}},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ProfilesFromCommand(tc.argv, tc.ins)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ProfilesFromCommand(%q) = %+v, %v\nwant %+v", tc.argv, got, err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"min without max", trt("--minShapes=x:1x3x224x224", "--optShapes=x:4x3x224x224"), "profile 0: give all of --minShapes, --optShapes and --maxShapes"},
		{"name missing in max", trt("--minShapes=x:1x3x224x224,mask:1x10", "--optShapes=x:4x3x224x224,mask:1x10", "--maxShapes=x:8x3x224x224"), `input "mask" is in --minShapes but not in --maxShapes`},
		{"unknown input", trt("--optShapes=y:4x3"), `the shapes name "y", which is not an input of the engine (inputs: mask, x)`},
		{"rank", trt("--optShapes=x:4x3x224"), `input "x": the shapes give 3 dimensions ([4,3,224]) but the model input has shape [-1,3,224,224]`},
		{"ranks differ", trt("--minShapes=x:1x3x224x224", "--optShapes=x:4x3x224x224", "--maxShapes=x:8x3x224"), "of different ranks"},
		{"profile gap", trt("--profile=1", "--optShapes=x:4x3x224x224"), "--profile=1: profiles are numbered in order; want 0..0"},
		{"bad spec", trt("--maxShapes=x:8x3x224xN"), `--maxShapes: shapes entry 0 "x:8x3x224xN": dimension "N" is not a size`},
	} {
		if _, err := ProfilesFromCommand(tc.argv, ins); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ProfilesFromCommand(%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	p := Profile{Inputs: []ProfileInput{pi("a", []int64{1, 4}, []int64{4, 4}, []int64{16, 4}), pi("b", []int64{1}, []int64{2}, []int64{8}), pi("s", nil, nil, nil)}}
	if n, ok := p.MaxBatch(); !ok || n != 8 {
		t.Errorf("Profile.MaxBatch() = %d, %v, want 8 (the smallest max first dimension)", n, ok)
	}
	if _, ok := (Profile{Inputs: []ProfileInput{pi("s", nil, nil, nil)}}).MaxBatch(); ok {
		t.Error("Profile.MaxBatch() of scalars only = ok, want not ok")
	}
}

// planSig is a TensorRT plan's signature with its profiles: x takes batches
// 1..8 of [3, 1..256, 224] in profile 0 and 1..32 in profile 1, and the
// state h_in [1..16].
func planSig(t *testing.T) Signature {
	t.Helper()
	sig := sigOf([]TensorSig{tsig("x", f32, -1, 3, -1, 224), tsig("h_in", f32, -1, -1)}, []TensorSig{tsig("y", f32, -1, 10), tsig("h_out", f32, -1, -1)})
	var err error
	sig.Profiles, err = ProfilesFromCommand([]string{"trtexec",
		"--profile=0", "--minShapes=x:1x3x1x224,h_in:1x1", "--optShapes=x:4x3x128x224,h_in:4x8", "--maxShapes=x:8x3x256x224,h_in:8x16",
		"--profile=1", "--minShapes=x:1x3x1x224,h_in:1x1", "--optShapes=x:16x3x128x224,h_in:16x8", "--maxShapes=x:32x3x256x224,h_in:32x16"}, sig.Inputs)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func TestCheckSignatureProfiles(t *testing.T) {
	sig := planSig(t)
	const (
		xy    = `input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, -1, 224 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ] `
		state = `sequence_batching { state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ -1 ] } ] } `
		io    = xy + state
	)
	for _, tc := range []struct {
		name, config string
		sev          Severity
		path         string
		keywords     []string
	}{
		{"max batch beyond profile", `max_batch_size: 16 ` + io, SeverityError, "max_batch_size",
			[]string{"configuration specified max-batch 16 but the TensorRT plan only supports max-batch 8", "profile 0", "input 'x' with max shape [8,3,256,224]", "set max_batch_size: 8"}},
		{"max batch beyond both profiles", `max_batch_size: 64 instance_group [ { profile: [ "0", "1" ] } ] ` + io, SeverityError, "max_batch_size",
			[]string{"only supports max-batch 32", "profile 1"}},
		{"dim above max", `max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 300, 224 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]`, SeverityError, "input[0].dims[1]",
			[]string{"invalid shape for input 'x'", "profile 0 of the TensorRT plan expects dimension 2 (batch included) to be between 1 and 256 but the configuration gives 300", "use a size in 1..256"}},
		{"reshape above max", `max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 900, 224 ] reshape { shape: [ 3, 300, 224 ] } } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]`, SeverityError, "input[0].reshape.shape[1]",
			[]string{"between 1 and 256 but the configuration gives 300"}},
		{"no batching, full shape", `max_batch_size: 0 input [ { name: "x" data_type: TYPE_FP32 dims: [ 12, 3, 16, 224 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 10 ] } ]`, SeverityError, "input[0].dims[0]",
			[]string{"dimension 0 (batch included) to be between 1 and 8 but the configuration gives 12"}},
		{"state above max", `max_batch_size: 8 ` + xy + strings.Replace(state, "-1", "20", 1), SeverityError, "sequence_batching.state[0].dims[0]",
			[]string{"invalid shape for input 'h_in'", "between 1 and 16 but the configuration gives 20"}},
		{"profile beyond plan", `max_batch_size: 8 instance_group [ { profile: [ "2" ] } ] ` + io, SeverityError, "instance_group[0].profile[0]",
			[]string{"configuration specified invalid profile 2; the TensorRT plan has 2 optimization profile(s), 0..1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(`platform: "tensorrt_plan" ` + tc.config))
			if err != nil {
				t.Fatal(err)
			}
			ps := CheckSignature(c, sig)
			if !findProblem(ps, tc.sev, tc.path, tc.keywords...) {
				t.Errorf("CheckSignature(%s) =\n%s\nwant a %s at %s containing %q", tc.name, problemList(ps), tc.sev, tc.path, tc.keywords)
			}
		})
	}
	clean := []string{
		`max_batch_size: 8 ` + io,
		`max_batch_size: 32 instance_group [ { profile: [ "1" ] } ] ` + io,
		`max_batch_size: 32 instance_group [ { profile: [ "0" ] }, { profile: [ "1" ] } ] ` + io,
	}
	for _, config := range clean {
		c, err := Parse([]byte(`platform: "tensorrt_plan" ` + config))
		if err != nil {
			t.Fatal(err)
		}
		if ps := CheckSignature(c, sig); len(ps) != 0 {
			t.Errorf("CheckSignature(%s) =\n%s\nwant no problems", config, problemList(ps))
		}
	}
	// A profile that refuses batches below its minimum: Triton's batcher
	// still sends them.
	sig.Profiles[0].Inputs[0].Min[0] = 2
	c, err := Parse([]byte(`platform: "tensorrt_plan" max_batch_size: 8 ` + io))
	if err != nil {
		t.Fatal(err)
	}
	if ps := CheckSignature(c, sig); !findProblem(ps, SeverityWarning, "max_batch_size", "profile 0 of the plan takes input 'x' from batch 2") {
		t.Errorf("CheckSignature(profile min batch 2) =\n%s\nwant a warning", problemList(ps))
	}
}

// writePlanRepo lays out a TensorRT model (a placeholder plan) with the
// given config and records it in kiln.json with sig and the trtexec
// command that built it.
func writePlanRepo(t *testing.T, repo, name, config string, sig Signature, command []string) {
	t.Helper()
	dir := filepath.Join(repo, name)
	if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "1", "model.plan"), []byte("engine bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := manifest.New("kiln test")
	if old, err := manifest.Read(repo); err == nil {
		m = old
	}
	m.Put(&manifest.Model{Name: name, Variant: manifest.Variant{Runtime: manifest.RuntimeTRT, Precision: manifest.FP16},
		Source: manifest.DigestBytes([]byte("src")), Version: 1, Status: manifest.StatusOK,
		Inputs: ManifestTensors(sig.Inputs), Outputs: ManifestTensors(sig.Outputs),
		Build: &manifest.Build{Tool: "trtexec", Command: command}})
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// LintRepository, as serve calls it (no LintOptions.Plans), checks each
// plan's config against the profiles kiln.json's trtexec command built.
func TestLintRepositoryPlanProfiles(t *testing.T) {
	sig := sigOf([]TensorSig{tsig("images", f32, -1, 3, 224, 224)}, []TensorSig{tsig("logits", f32, -1, 1000)})
	build := []string{"/opt/tensorrt/bin/trtexec", "--onnx=model.onnx", "--saveEngine=model.plan",
		"--minShapes=images:1x3x224x224", "--optShapes=images:4x3x224x224", "--maxShapes=images:8x3x224x224", "--fp16"}
	repo := t.TempDir()
	gen := func(name string, mbs int) string {
		t.Helper()
		c, err := Generate(sig, GenerateOptions{Name: name, Platform: PlatformTensorRT, MaxBatchSize: mbs})
		if err != nil {
			t.Fatal(err)
		}
		return string(Print(c))
	}
	writePlanRepo(t, repo, "fits", gen("fits", 8), sig, build)
	writePlanRepo(t, repo, "too_big", gen("too_big", 16), sig, build)
	writePlanRepo(t, repo, "autofilled", `platform: "tensorrt_plan"`, sig, build)
	ps, err := LintRepository(repo, LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var fits, big, auto Problems
	for _, p := range ps.Errors() {
		switch filepath.Base(p.File) {
		case "fits":
			fits = append(fits, p)
		case "too_big":
			big = append(big, p)
		case "autofilled":
			auto = append(auto, p)
		}
	}
	if len(fits) != 0 || len(auto) != 0 {
		t.Errorf("LintRepository: the configs within the profile have errors\n%s%s", problemList(fits), problemList(auto))
	}
	if !findProblem(big, SeverityError, "max_batch_size", "max-batch 16 but the TensorRT plan only supports max-batch 8", "input 'images' with max shape [8,3,224,224]") {
		t.Errorf("LintRepository(max_batch_size 16, plan built up to 8) =\n%s\nwant the profile's max batch reported", problemList(ps))
	}
	writePlanRepo(t, repo, "garbled", gen("garbled", 8), sig, append(build, "--maxShapes=images:8x3x224"))
	if _, err := LintRepository(repo, LintOptions{}); err == nil || !strings.Contains(err.Error(), "model garbled: recorded trtexec command: profile 0") {
		t.Errorf("LintRepository(kiln.json with an unreadable trtexec command) = %v, want an error naming the model and the command", err)
	}
}

// Triton's own case: a plan whose profile takes dimension 1 in 4..32 and a
// config asking for 33 (L0_model_config autofill_noplatform/tensorrt).
func TestLintTritonBadDynamicShapesMax(t *testing.T) {
	const name = "bad_dynamic_shapes_max"
	config, err := os.ReadFile(filepath.Join(testutil.Corpus(t, "triton-configs", "L0_model_config", "autofill_noplatform", "tensorrt", name), ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	sig := sigOf([]TensorSig{tsig("INPUT0", f32, -1, -1), tsig("INPUT1", f32, -1, -1)}, []TensorSig{tsig("OUTPUT0", f32, -1, -1), tsig("OUTPUT1", f32, -1, -1)})
	repo := t.TempDir()
	writePlanRepo(t, repo, name, string(config), sig, []string{"trtexec", "--onnx=model.onnx", "--saveEngine=model.plan",
		"--minShapes=INPUT0:1x4,INPUT1:1x4", "--optShapes=INPUT0:4x16,INPUT1:4x16", "--maxShapes=INPUT0:8x32,INPUT1:8x32"})
	ps, err := LintPath(filepath.Join(repo, name), LintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !findProblem(ps, SeverityError, "input[0].dims[0]", "invalid shape for input 'INPUT0'", "dimension 1 (batch included) to be between 4 and 32 but the configuration gives 33") {
		t.Errorf("LintPath(%s) =\n%s\nwant Triton's error for INPUT0", name, problemList(ps))
	}
}
