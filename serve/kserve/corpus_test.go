package kserve

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// example is one raw HTTP example of the corpus: start line, headers,
// then the JSON body with no blank line between.
type example struct {
	start  string
	header map[string]string
	body   []byte
}

func readExample(path string) (*example, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitAfter(string(raw), "\n")
	ex := &example{start: strings.TrimSpace(lines[0]), header: map[string]string{}}
	for i, l := range lines[1:] {
		if strings.HasPrefix(l, "{") {
			ex.body = []byte(strings.Join(lines[1+i:], ""))
			return ex, nil
		}
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			return nil, fmt.Errorf("%s: line %d is neither a header nor the body: %q", path, i+2, l)
		}
		ex.header[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return nil, fmt.Errorf("%s: no JSON body", path)
}

// TestCorpusExamples decodes every request and response example strictly
// and pins exactly where the upstream ones are malformed:
//
//   - oip_infer_request.http: input1 has shape [3] but one datum;
//   - the three response examples miss the comma after "id" : "42"
//     (line 3, column 3 of the body, where "outputs" starts);
//   - the two classification responses, comma restored, still fail: their
//     datatype "STRING" is Triton's v1 name, v2 calls it BYTES.
//
// triton_classification_request.http and gke_marketplace_bert_request.json
// are valid.
func TestCorpusExamples(t *testing.T) {
	dir := testutil.Corpus(t, "kserve-v2")
	tests := []struct {
		file    string
		wantErr string // "" decodes
		fixed   string // the error once the missing comma is restored; "" decodes
	}{
		{file: "oip_infer_request.http", wantErr: `input "input1": 1 data values for shape [3] (want 3)`},
		{file: "triton_classification_request.http"},
		{file: "oip_infer_response.http", wantErr: "invalid character '\"' after object key:value pair at line 3, column 3"},
		{file: "triton_classification_response.http", wantErr: "at line 3, column 3", fixed: `output "output0": unknown datatype "STRING"`},
		{file: "triton_classification_response_with_labels.http", wantErr: "at line 3, column 3", fixed: `output "output0": unknown datatype "STRING"`},
	}
	files, _ := filepath.Glob(filepath.Join(dir, "spec-examples", "*.http"))
	if len(files) != len(tests) {
		t.Errorf("%d examples in the corpus, the test knows %d: update it", len(files), len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			ex, err := readExample(filepath.Join(dir, "spec-examples", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			isResponse := strings.HasPrefix(ex.start, "HTTP/")
			decode := func(body []byte) error {
				if isResponse {
					_, err := DecodeResponse(body, -1)
					return err
				}
				_, err := DecodeRequest(body, -1)
				return err
			}
			err = decode(ex.body)
			t.Logf("strict: %v", err)
			checkErr(t, "strict", err, tt.wantErr)
			if isResponse {
				fixed := bytes.Replace(ex.body, []byte(`"id" : "42"`), []byte(`"id" : "42",`), 1)
				err = decode(fixed)
				t.Logf("comma restored: %v", err)
				checkErr(t, "comma restored", err, tt.fixed)
			}
			if !isResponse {
				// dataset.ParseRequest, the tolerant reader of stored
				// requests, must agree with the server's decoder.
				_, derr := dataset.ParseRequest(ex.body)
				if (derr == nil) != (tt.wantErr == "") {
					t.Errorf("dataset.ParseRequest = %v, the server's decoder says %q", derr, tt.wantErr)
				}
			}
		})
	}
}

func checkErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s: %v, want it to decode", what, err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("%s: error %v, want one containing %q", what, err, want)
	}
}

func TestCorpusBertRequest(t *testing.T) {
	path := filepath.Join(testutil.Corpus(t, "kserve-v2"), "gke_marketplace_bert_request.json")
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	req, err := DecodeRequest(body, -1)
	if err != nil {
		t.Fatalf("DecodeRequest(%s): %v", path, err)
	}
	names := []string{"input_ids", "input_mask", "segment_ids"}
	if len(req.Inputs) != len(names) {
		t.Fatalf("%d inputs, want %d", len(req.Inputs), len(names))
	}
	theirs, err := dataset.ParseRequest(body)
	if err != nil {
		t.Fatalf("dataset.ParseRequest: %v", err)
	}
	for i, in := range req.Inputs {
		if in.Name != names[i] || in.Type != onnx.Int32 || fmt.Sprint(in.Dims) != "[1 128]" {
			t.Errorf("input %d = %s %s %v, want %s INT32 [1 128]", i, in.Name, in.Type, in.Dims, names[i])
		}
		if err := sameTensor(theirs[in.Name], in); err != nil {
			t.Errorf("server decoder and dataset.ParseRequest differ: %v", err)
		}
	}
	if len(req.Outputs) != 1 || req.Outputs[0].Name != "cls_squad_logits" || req.Outputs[0].Binary {
		t.Errorf("outputs = %+v, want cls_squad_logits as JSON", req.Outputs)
	}
}

// perf_analyzer's --input-data files are not v2 requests (the dataset
// package reads them): the decoder must say so rather than guess.
func TestCorpusPerfAnalyzerData(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(testutil.Corpus(t, "kserve-v2"), "perf_analyzer_input_data", "*.json"))
	if len(files) == 0 {
		t.Skip("no perf_analyzer input data in the corpus")
	}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeRequest(body, -1); err == nil || !strings.Contains(err.Error(), "request has no inputs") {
			t.Errorf("DecodeRequest(%s) = %v, want \"request has no inputs\"", filepath.Base(f), err)
		}
	}
}
