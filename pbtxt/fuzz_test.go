package pbtxt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// FuzzParse checks that the parser never panics, that every error is a
// *SyntaxError, and that whatever parses survives print → parse unchanged
// with byte-stable output. Validation, auto-complete and the signature check
// (with and without a plan's profiles) run on every parsed config too, to
// prove they do not panic on odd input.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*", "*.golden"))
	corpus, _ := filepath.Glob(testutil.CorpusPath(f, "triton-configs", "*", "*", "config.pbtxt"))
	for _, p := range append(seeds, corpus...) {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"", "name: \"m\"", "input [ { dims: [ -1, 0x10, 010 ] reshape { shape: [ ] } } ]",
		"sequence_batching { control_input [ { control [ { fp32_false_true: [ nan, -inf, 1e39 ] } ] } ] }",
		"dynamic_batching { priority_queue_policy { key: 18446744073709551615 value: < timeout_action: 1 > } }",
		"parameters: { key: 'a\\x00' value { string_value: \"\\u00e9\" } }",
		"platform: \"ensemble\" ensemble_scheduling { step [ { model_name: \"a\" input_map { key: \"x\" value: \"t\" } output_map { key: \"y\" value: \"t\" } } ] }",
	} {
		f.Add([]byte(s))
	}
	sig := Signature{
		Inputs:  []TensorSig{{Name: "x", DataType: 11, Shape: []int64{-1, 3}}, {Name: "s", DataType: 9}},
		Outputs: []TensorSig{{Name: "y", DataType: 11, Unranked: true}},
	}
	plan := sig
	var err error
	if plan.Profiles, err = ProfilesFromCommand([]string{"trtexec", "--minShapes=x:1x3", "--optShapes=x:2x3", "--maxShapes=x:8x3"}, sig.Inputs); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Line < 1 || se.Col < 1 {
				t.Fatalf("Parse error %v is not a positioned *SyntaxError", err)
			}
			return
		}
		out := Print(c)
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Print(c)) = %v\n%s", err, out)
		}
		if !proto.Equal(c, back) {
			t.Fatalf("Parse(Print(c)) differs from c\n%s", out)
		}
		if again := Print(back); !bytes.Equal(again, out) {
			t.Fatalf("Print is not stable:\n%s\n---\n%s", out, again)
		}
		Validate(c, ValidateOptions{DirName: "m", GPUs: 2})
		CheckSignature(c, sig)
		CheckSignature(c, plan)
		planAutofillMaxBatch(Clone(c), plan)
		cc := Clone(c)
		if Autofill(cc, "m", sig, AutofillOptions{DefaultMaxBatchSize: 4, GPUs: []int32{0}, Normalize: true}) == nil {
			Validate(cc, ValidateOptions{})
		}
	})
}

// FuzzShapeSpec checks that whatever ParseShapeSpec accepts prints back to
// a spec that parses to the same entries, with byte-stable output, and that
// turning it into profiles never panics. The seeds include every shapes
// flag of the captured trtexec logs.
func FuzzShapeSpec(f *testing.F) {
	logs, _ := filepath.Glob(testutil.CorpusPath(f, "trt-logs", "trtexec", "*.log"))
	flag := regexp.MustCompile(`--(?:min|opt|max)?[sS]hapes=(\S+)`)
	for _, p := range logs {
		data, _ := os.ReadFile(p)
		for _, m := range flag.FindAllSubmatch(data, -1) {
			f.Add(string(m[1]))
		}
	}
	for _, s := range []string{
		"", "input0:1x3x256x256,input1:1x3x128x128", "'input:0':1x3x224x224", "x:0:4x1x28x28",
		"in0:scalar,in1:", "in*:8x3,in1:2x3", "a'b':1", "'':1", "x:1x,y:2", "x:007x1",
	} {
		f.Add(s)
	}
	ins := []TensorSig{{Name: "x", DataType: 11, Shape: []int64{-1, 3}}, {Name: "input:0", DataType: 11, Shape: []int64{-1}}, {Name: "u", DataType: 11, Unranked: true}}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseShapeSpec(s)
		if err != nil {
			return
		}
		out := spec.String()
		back, err := ParseShapeSpec(out)
		if err != nil {
			t.Fatalf("ParseShapeSpec(%q) = %v, want the printed form of %q to parse", out, err, s)
		}
		if !sameSpec(spec, back) {
			t.Fatalf("ParseShapeSpec(%q) = %v, want %v (printed from %q)", out, back, spec, s)
		}
		if again := back.String(); again != out {
			t.Fatalf("String is not stable: %q then %q", out, again)
		}
		for _, flags := range [][]string{{"--optShapes=" + s}, {"--minShapes=" + s, "--optShapes=" + s, "--maxShapes=" + s}} {
			ProfilesFromCommand(append([]string{"trtexec"}, flags...), ins)
		}
	})
}

// sameSpec compares specs, a scalar's nil and empty dims alike.
func sameSpec(a, b ShapeSpec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || len(a[i].Dims) != len(b[i].Dims) || (len(a[i].Dims) > 0 && !reflect.DeepEqual(a[i].Dims, b[i].Dims)) {
			return false
		}
	}
	return true
}
