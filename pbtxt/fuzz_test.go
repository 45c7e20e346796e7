package pbtxt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/internal/testutil"
)

// FuzzParse checks that the parser never panics, that every error is a
// *SyntaxError, and that whatever parses survives print → parse unchanged
// with byte-stable output. Validation, auto-complete and the signature check
// run on every parsed config too, to prove they do not panic on odd input.
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
		cc := Clone(c)
		if Autofill(cc, "m", sig, AutofillOptions{DefaultMaxBatchSize: 4, GPUs: []int32{0}, Normalize: true}) == nil {
			Validate(cc, ValidateOptions{})
		}
	})
}
