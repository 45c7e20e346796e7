package kserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

func TestEndpoints(t *testing.T) {
	models := []Model{affineModel("affine", &affine{}, 8, 0), echoModel(),
		affineModel("affine", &affine{}, 0, 0)}
	models[2].Version = "10"
	e := start(t, models, Options{Version: "1.2.3"})
	ctx := context.Background()
	for name, probe := range map[string]func(context.Context) (bool, error){"Live": e.c.Live, "Ready": e.c.Ready} {
		if ok, err := probe(ctx); !ok || err != nil {
			t.Errorf("%s() = %v, %v, want true", name, ok, err)
		}
	}
	md, err := e.c.ServerMetadata(ctx)
	if err != nil || md.Name != "kiln" || md.Version != "1.2.3" || !slices.Contains(md.Extensions, "binary_tensor_data") {
		t.Errorf("ServerMetadata() = %+v, %v, want kiln 1.2.3 with binary_tensor_data", md, err)
	}
	tests := []struct {
		model, version string
		want           ModelMetadata
	}{
		{"affine", "", ModelMetadata{Name: "affine", Versions: []string{"1", "10"}, Platform: "kiln_test",
			Inputs:  []TensorMeta{{Name: "x", Datatype: "FP32", Shape: []int64{4}}},
			Outputs: []TensorMeta{{Name: "y", Datatype: "FP32", Shape: []int64{4}}}}},
		{"affine", "1", ModelMetadata{Name: "affine", Versions: []string{"1"}, Platform: "kiln_test",
			Inputs:  []TensorMeta{{Name: "x", Datatype: "FP32", Shape: []int64{-1, 4}}},
			Outputs: []TensorMeta{{Name: "y", Datatype: "FP32", Shape: []int64{-1, 4}}}}},
	}
	for _, tt := range tests {
		got, err := e.c.ModelMetadata(ctx, tt.model, tt.version)
		if err != nil || !reflect.DeepEqual(*got, tt.want) {
			t.Errorf("ModelMetadata(%s, %q) = %+v, %v, want %+v", tt.model, tt.version, got, err, tt.want)
		}
		if ok, err := e.c.ModelReady(ctx, tt.model, tt.version); !ok || err != nil {
			t.Errorf("ModelReady(%s, %q) = %v, %v, want true", tt.model, tt.version, ok, err)
		}
	}
	for _, mv := range [][2]string{{"nope", ""}, {"affine", "2"}} {
		_, err := e.c.ModelMetadata(ctx, mv[0], mv[1])
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusNotFound || !strings.HasPrefix(he.URL, "/v2/models/") {
			t.Errorf("ModelMetadata(%s, %q) = %v, want an *HTTPError 404 with the path", mv[0], mv[1], err)
		}
		if ok, err := e.c.ModelReady(ctx, mv[0], mv[1]); ok || !errors.As(err, &he) || he.Status != http.StatusNotFound {
			t.Errorf("ModelReady(%s, %q) = %v, %v, want false and a 404", mv[0], mv[1], ok, err)
		}
	}
	index, err := e.c.RepositoryIndex(ctx)
	want := []RepositoryModel{{"affine", "1", "READY", ""}, {"affine", "10", "READY", ""}, {"echo", "3", "READY", ""}}
	if err != nil || !reflect.DeepEqual(index, want) {
		t.Errorf("RepositoryIndex() = %+v, %v, want %+v", index, err, want)
	}
	if err := e.c.WaitReady(ctx, 10*time.Millisecond); err != nil {
		t.Errorf("WaitReady: %v", err)
	}
}

// The highest version serves requests without one.
func TestVersionlessInferUsesLatest(t *testing.T) {
	old := affineModel("m", failing{}, 0, 0)
	old.Version = "2"
	latest := affineModel("m", &affine{}, 0, 0)
	latest.Version = "10"
	e := start(t, []Model{old, latest}, Options{})
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{4}, Data: []float32{0, 1, 2, 3}}
	if _, err := e.c.Infer(context.Background(), "m", "", map[string]*onnx.Tensor{"x": x}, nil, false); err != nil {
		t.Errorf("Infer(m) = %v, want version 10 to answer", err)
	}
}

func TestInferTypes(t *testing.T) {
	e := start(t, []Model{affineModel("affine", &affine{}, 8, 0), echoModel()}, Options{})
	ctx := context.Background()
	for _, binary := range []bool{false, true} {
		t.Run(fmt.Sprintf("binary=%v", binary), func(t *testing.T) {
			x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{2, 4}, Data: floats(8, func(i int) float32 { return float32(i) - 3.5 })}
			got, err := e.c.Infer(ctx, "affine", "", map[string]*onnx.Tensor{"x": x}, nil, binary)
			if err != nil {
				t.Fatalf("Infer(affine): %v", err)
			}
			want := &onnx.Tensor{Name: "y", Type: onnx.Float, Dims: []int64{2, 4}, Data: floats(8, func(i int) float32 { return 2*(float32(i)-3.5) + 1 })}
			if err := sameTensor(want, got["y"]); err != nil {
				t.Error(err)
			}
			in := echoInputs()
			got, err = e.c.Infer(ctx, "echo", "3", in, []string{"s_out", "f16_out", "f32_out", "i64_out", "b_out"}, binary)
			if err != nil {
				t.Fatalf("Infer(echo): %v", err)
			}
			for name, t0 := range in {
				w := *t0
				w.Name = name + "_out"
				if err := sameTensor(&w, got[w.Name]); err != nil {
					t.Error(err)
				}
			}
			got, err = e.c.Infer(ctx, "echo", "3", in, []string{"b_out"}, binary)
			if err != nil || len(got) != 1 || got["b_out"] == nil {
				t.Errorf("Infer(echo, outputs [b_out]) = %v, %v, want only b_out", got, err)
			}
		})
	}
}

// The server echoes the request id, and a JSON request can ask for
// binary outputs, one of them overridden back to JSON.
func TestInferIDAndMixedOutputs(t *testing.T) {
	e := start(t, []Model{echoModel()}, Options{})
	in := echoInputs()
	req := &Request{ID: "req-42", BinaryOutput: true,
		Outputs: []OutputRequest{{Name: "f32_out", Binary: false}, {Name: "s_out", Binary: true}}}
	for _, n := range []string{"b", "f16", "f32", "i64", "s"} {
		c := *in[n]
		c.Name = n
		req.Inputs = append(req.Inputs, &c)
	}
	body, n, err := EncodeRequest(req, false)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(e.hs.URL+"/v2/models/echo/infer", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if n != len(body) || resp.Header.Get(HeaderContentLength) == "" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("headers %v: want a binary answer to a JSON request", resp.Header)
	}
	var hl int
	fmt.Sscan(resp.Header.Get(HeaderContentLength), &hl)
	var head struct {
		ID      string `json:"id"`
		Outputs []struct {
			Name       string          `json:"name"`
			Data       json.RawMessage `json:"data"`
			Parameters map[string]any  `json:"parameters"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(raw[:hl], &head); err != nil {
		t.Fatal(err)
	}
	if head.ID != "req-42" || len(head.Outputs) != 2 || head.Outputs[0].Data == nil || head.Outputs[1].Parameters["binary_data_size"] == nil {
		t.Errorf("answer %s: want id req-42, f32_out as JSON and s_out as binary", raw[:hl])
	}
}

// badCall is a raw request the client would not send.
type badCall struct {
	name, path, body string
	header           map[string]string
	status           int
	want             string
}

func TestBadRequests(t *testing.T) {
	e := start(t, []Model{affineModel("affine", &affine{}, 4, 0), affineModel("broken", failing{}, 0, 0), echoModel()}, Options{})
	x := func(shape, dt, data string) string {
		return `{"inputs":[{"name":"x","shape":` + shape + `,"datatype":"` + dt + `","data":` + data + `}]}`
	}
	four := "[0,1,2,3]"
	trunc := `{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}`
	tests := []badCall{
		{"wrong shape", "affine", x("[1,3]", "FP32", "[1,2,3]"), nil, 400, `input "x": shape [1 3], want [-1 4]`},
		{"wrong rank", "affine", x("[4]", "FP32", four), nil, 400, `input "x": shape [4] has rank 1, want 2`},
		{"batch too big", "affine", x("[5,4]", "FP32", "["+strings.Repeat("1,", 19)+"1]"), nil, 400, "batch size 5 is not in [1,4]"},
		{"wrong dtype", "affine", x("[1,4]", "FP64", four), nil, 400, `input "x": datatype FP64, want FP32`},
		{"missing input", "echo", `{"inputs":[{"name":"f32","shape":[1],"datatype":"FP32","data":[1]}]}`, nil, 400, `model echo: missing input "f16"`},
		{"unknown input", "affine", `{"inputs":[{"name":"z","shape":[1],"datatype":"FP32","data":[1]}]}`, nil, 400, `unknown input "z"`},
		{"unknown output", "affine", x("[1,4]", "FP32", four)[:len(x("[1,4]", "FP32", four))-1] + `,"outputs":[{"name":"q"}]}`, nil, 400, `unknown output "q"`},
		{"classification", "affine", x("[1,4]", "FP32", four)[:len(x("[1,4]", "FP32", four))-1] + `,"outputs":[{"name":"y","parameters":{"classification":2}}]}`, nil, 400, "parameter classification is not supported"},
		{"invalid JSON", "affine", `{"inputs":`, nil, 400, "parsing request JSON"},
		{"unknown model", "nope", x("[1,4]", "FP32", four), nil, 404, `unknown model "nope"`},
		{"unknown version", "affine/versions/7", x("[1,4]", "FP32", four), nil, 404, `unknown version "7" of model "affine"`},
		{"truncated binary", "affine", trunc + "\x00\x00\x00\x00", map[string]string{HeaderContentLength: strconv.Itoa(len(trunc))},
			400, `input "x": binary_data_size is 16 but only 4 bytes of binary data are left (truncated binary data)`},
		{"bad header length", "affine", x("[1,4]", "FP32", four), map[string]string{HeaderContentLength: "-3"}, 400, "is not a byte count"},
		{"runner failure", "broken", x("[4]", "FP32", four), nil, 500, "running model broken version 1: the accelerator caught fire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, e.hs.URL) })
	}
	t.Run("no such endpoint", func(t *testing.T) {
		resp, err := http.Get(e.hs.URL + "/v3/nothing")
		if err != nil {
			t.Fatal(err)
		}
		checkErrorAnswer(t, resp, 404, "no endpoint GET /v3/nothing")
	})
	goodRequest(t, e)
}

func (tt badCall) run(t *testing.T, base string) {
	req, err := http.NewRequest(http.MethodPost, base+"/v2/models/"+tt.path+"/infer", strings.NewReader(tt.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range tt.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	checkErrorAnswer(t, resp, tt.status, tt.want)
}

// checkErrorAnswer checks status and that the body is {"error": "...want..."}.
func checkErrorAnswer(t *testing.T, resp *http.Response, status int, want string) {
	t.Helper()
	defer resp.Body.Close()
	var eb errorBody
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &eb); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer %q (%s) is not a JSON error: %v", raw, resp.Header.Get("Content-Type"), err)
	}
	if resp.StatusCode != status || !strings.Contains(eb.Error, want) {
		t.Errorf("answer %d %q, want %d with %q", resp.StatusCode, eb.Error, status, want)
	}
}

// goodRequest checks that the server still answers after bad requests.
func goodRequest(t *testing.T, e *env) {
	t.Helper()
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 4}, Data: []float32{1, 2, 3, 4}}
	got, err := e.c.Infer(context.Background(), "affine", "", map[string]*onnx.Tensor{"x": x}, nil, true)
	if err != nil {
		t.Fatalf("a good request after bad ones: %v", err)
	}
	if ys := got["y"].Data.([]float32); !slices.Equal(ys, []float32{3, 5, 7, 9}) {
		t.Errorf("y = %v, want [3 5 7 9]", ys)
	}
}

// zeros reads as n zero bytes without holding them.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// A 100 MB body gets 413 whether its length is declared (not read at all)
// or chunked (read up to the limit), and the server stays up.
func TestBodyTooLarge(t *testing.T) {
	e := start(t, []Model{affineModel("affine", &affine{}, 4, 0)}, Options{})
	const size = 100 << 20
	for _, declared := range []bool{true, false} {
		t.Run(fmt.Sprintf("declared=%v", declared), func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, e.hs.URL+"/v2/models/affine/infer", &zeros{size})
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = -1
			if declared {
				req.ContentLength = size
			}
			resp, err := e.hs.Client().Do(req)
			if err != nil {
				t.Fatalf("POST 100 MB: %v", err)
			}
			checkErrorAnswer(t, resp, http.StatusRequestEntityTooLarge, "over the limit of 67108864 bytes")
		})
	}
	goodRequest(t, e)
}

func TestNewServerErrors(t *testing.T) {
	ok := affineModel("m", &affine{}, 4, 0)
	with := func(f func(*Model)) Model {
		m := affineModel("m", &affine{}, 4, 0)
		f(&m)
		return m
	}
	tests := []struct {
		name   string
		models []Model
		opts   Options
		want   string
	}{
		{"twice", []Model{ok, ok}, Options{}, "model m version 1 is given twice"},
		{"no runner", []Model{with(func(m *Model) { m.Runner = nil })}, Options{}, "model m has no runner"},
		{"bad datatype", []Model{with(func(m *Model) { m.Inputs[0].Datatype = "FLOAT" })}, Options{}, `model m tensor x: unknown datatype "FLOAT"`},
		{"preferred", []Model{with(func(m *Model) { m.PreferredBatchSizes = []int{8} })}, Options{}, "preferred batch size 8 is not in [1,4]"},
		{"same name", []Model{with(func(m *Model) { m.Outputs[0].Name = "x" })}, Options{}, `tensor name "x" is empty or used twice`},
		{"negative", []Model{ok}, Options{MaxConcurrency: -1}, "negative MaxConcurrency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewServer(tt.models, tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewServer = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	e := start(t, []Model{ok}, Options{})
	if _, err := NewServer([]Model{ok}, Options{Registerer: e.metrics}); err == nil || !strings.Contains(err.Error(), "give each Server its own registry") {
		t.Errorf("a second NewServer on one registry = %v, want a clear error", err)
	}
}
