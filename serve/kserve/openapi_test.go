package kserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
)

// schema is the corpus's open_inference_rest.yaml, with the minimal fixes
// that let it validate real traffic. Its problems, each checked by
// loadSchema so that the workaround goes when upstream fixes it:
//
//  1. Paths are written /v2/models/${MODEL_NAME}/versions/${MODEL_VERSION}:
//     OpenAPI templates are {name}, so the "$" is a literal and no real URL
//     (/v2/models/m/versions/1) matches. Fixed by rewriting "${" to "{".
//  2. The server metadata path is /v2/ (trailing slash); the protocol's is
//     GET v2. Fixed by serving it as /v2 (kiln's server answers both).
//  3. The protocol makes /versions/${MODEL_VERSION} optional, but the file
//     has only the versioned paths: /v2/models/{m}, .../ready and .../infer
//     are missing. Fixed by adding copies without the version parameter.
//  4. The binary tensor data extension cannot be expressed: request_input
//     and response_output require "data", and no operation accepts
//     application/octet-stream. Bodies with binary data are validated by
//     their JSON part, against a copy of the schema where "data" is optional.
//  5. Only 200 (and 400 for metadata and infer) are declared; the 404, 413,
//     500 and 503 answers are checked against the error object schema
//     directly, and inference_error_response does not require "error" (the
//     other error schemas do), so metadata_model_error_response is used.
//  6. Triton's repository index (POST /v2/repository/index) is an extension
//     the file does not describe: it is not validated.
//  7. x-examples of inference_request are wrong, though no validator reads
//     them: "Example 1" gives input1 shape [3] with one datum and
//     "Example 2" is a response (outputs with data, no inputs).
type schema struct {
	doc             *openapi3.T
	strict, relaxed routers.Router
}

func loadSchema(t *testing.T) *schema {
	t.Helper()
	path := filepath.Join(testutil.Corpus(t, "kserve-v2"), "open_inference_rest.yaml")
	load := func() *openapi3.T {
		doc, err := openapi3.NewLoader().LoadFromFile(path)
		if err != nil {
			t.Fatalf("loading %s: %v", path, err)
		}
		return doc
	}
	doc := load()
	raw, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("routing %s as it is: %v", path, err)
	}
	for _, p := range []string{"/v2/models/m/versions/1", "/v2"} {
		if _, _, err := raw.FindRoute(httptest.NewRequest(http.MethodGet, p, nil)); err == nil {
			t.Errorf("GET %s now matches the schema as it is: drop the path workarounds", p)
		}
	}
	s := &schema{doc: fixPaths(t, doc)}
	relaxed := fixPaths(t, load())
	for _, name := range []string{"request_input", "response_output"} {
		sc := relaxed.Components.Schemas[name].Value
		sc.Required = slices.DeleteFunc(slices.Clone(sc.Required), func(r string) bool { return r == "data" })
	}
	if s.strict, err = gorillamux.NewRouter(s.doc); err != nil {
		t.Fatal(err)
	}
	if s.relaxed, err = gorillamux.NewRouter(relaxed); err != nil {
		t.Fatal(err)
	}
	return s
}

// fixPaths applies fixes 1 to 3.
func fixPaths(t *testing.T, doc *openapi3.T) *openapi3.T {
	t.Helper()
	paths := openapi3.NewPaths()
	for _, p := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(p)
		fixed := strings.ReplaceAll(p, "${", "{")
		if fixed == "/v2/" {
			fixed = "/v2"
		}
		paths.Set(fixed, item)
		if versionless, ok := strings.CutSuffix(fixed, "/versions/{MODEL_VERSION}"); ok || strings.Contains(fixed, "/versions/{MODEL_VERSION}/") {
			if !ok {
				versionless = strings.Replace(fixed, "/versions/{MODEL_VERSION}", "", 1)
			}
			c := *item
			for _, op := range []**openapi3.Operation{&c.Get, &c.Post} {
				if *op != nil {
					o := **op
					o.OperationID += "-unversioned"
					*op = &o
				}
			}
			c.Parameters = slices.DeleteFunc(slices.Clone(item.Parameters), func(p *openapi3.ParameterRef) bool {
				return p.Value != nil && p.Value.Name == "MODEL_VERSION"
			})
			paths.Set(versionless, &c)
		}
	}
	doc.Paths = paths
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the fixed schema does not validate: %v", err)
	}
	return doc
}

// errNotInSchema marks calls the schema does not describe.
var errNotInSchema = errors.New("not in the schema")

// check validates one exchange; responseOnly skips the request (for bad
// requests made on purpose).
func (s *schema) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte, responseOnly bool) error {
	ctx := context.Background()
	reqJSON, reqBinary, err := jsonPart(req.Header, reqBody)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	respJSON, respBinary, err := jsonPart(resp.Header, respBody)
	if err != nil {
		return fmt.Errorf("response: %w", err)
	}
	router := s.strict
	if reqBinary || respBinary {
		router = s.relaxed
	}
	vreq := req.Clone(ctx)
	vreq.Body, vreq.ContentLength = io.NopCloser(bytes.NewReader(reqJSON)), int64(len(reqJSON))
	if reqBinary {
		vreq.Header.Set("Content-Type", "application/json")
	}
	route, params, err := router.FindRoute(vreq)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotInSchema, err)
	}
	opts := &openapi3filter.Options{MultiError: true}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
	if !responseOnly {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			return fmt.Errorf("request: %w", err)
		}
	}
	hdr := resp.Header.Clone()
	if respBinary {
		hdr.Set("Content-Type", "application/json")
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: hdr,
		Body: io.NopCloser(bytes.NewReader(respJSON)), Options: opts}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Errorf("response: %w", err)
	}
	if resp.StatusCode/100 != 2 && route.Operation.Responses.Status(resp.StatusCode) == nil {
		return s.checkError(respJSON)
	}
	return nil
}

// checkError validates an undeclared error answer against the error object.
func (s *schema) checkError(body []byte) error {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("error answer is not JSON: %w: %q", err, body)
	}
	if err := s.doc.Components.Schemas["metadata_model_error_response"].Value.VisitJSON(v); err != nil {
		return fmt.Errorf("error answer %s: %w", body, err)
	}
	return nil
}

// jsonPart cuts the JSON part of a body with binary tensor data.
func jsonPart(h http.Header, body []byte) ([]byte, bool, error) {
	v := h.Get(HeaderContentLength)
	if v == "" {
		return body, false, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > len(body) {
		return nil, false, fmt.Errorf("bad %s %q for %d bytes", HeaderContentLength, v, len(body))
	}
	return body[:n], true, nil
}

// validating is a transport that validates every exchange.
type validating struct {
	t    *testing.T
	s    *schema
	next http.RoundTripper

	mu      sync.Mutex
	checked int
	skipped map[string]bool
}

type responseOnlyKey struct{}

func (v *validating) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		reqBody = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	resp, err := v.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	only, _ := req.Context().Value(responseOnlyKey{}).(bool)
	err = v.s.check(req, reqBody, resp, respBody, only)
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case errors.Is(err, errNotInSchema):
		v.skipped[req.Method+" "+req.URL.Path] = true
	case err != nil:
		v.t.Errorf("%s %s (%d): %v", req.Method, req.URL.Path, resp.StatusCode, err)
	default:
		v.checked++
	}
	return resp, nil
}

// TestOpenAPI runs the client against the server through a transport that
// validates every request the client sends and every answer the server
// gives against the corpus's schema.
func TestOpenAPI(t *testing.T) {
	s := loadSchema(t)
	e := start(t, []Model{affineModel("affine", &affine{}, 8, 0), echoModel(),
		affineModel("broken", failing{}, 0, 0)}, Options{})
	v := &validating{t: t, s: s, next: e.hs.Client().Transport, skipped: map[string]bool{}}
	c := NewClient(e.hs.URL, &http.Client{Transport: v})
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	_, err := c.Live(ctx)
	must("Live", err)
	_, err = c.Ready(ctx)
	must("Ready", err)
	_, err = c.ServerMetadata(ctx)
	must("ServerMetadata", err)
	for _, mv := range [][2]string{{"affine", ""}, {"echo", "3"}, {"echo", ""}} {
		_, err = c.ModelMetadata(ctx, mv[0], mv[1])
		must("ModelMetadata "+mv[0], err)
		_, err = c.ModelReady(ctx, mv[0], mv[1])
		must("ModelReady "+mv[0], err)
	}
	_, err = c.RepositoryIndex(ctx)
	must("RepositoryIndex", err)
	x := &onnx.Tensor{Type: onnx.Float, Dims: []int64{2, 4}, Data: floats(8, func(i int) float32 { return float32(i) })}
	for _, binary := range []bool{false, true} {
		_, err = c.Infer(ctx, "affine", "1", map[string]*onnx.Tensor{"x": x}, []string{"y"}, binary)
		must("Infer affine", err)
		_, err = c.Infer(ctx, "echo", "", echoInputs(), nil, binary)
		must("Infer echo", err)
	}
	// Answers to bad calls: 404, 400, 500.
	if _, err := c.ModelMetadata(ctx, "nope", ""); err == nil {
		t.Error("ModelMetadata(nope) succeeded")
	}
	if _, err := c.ModelReady(ctx, "affine", "9"); err == nil {
		t.Error("ModelReady(affine, 9) succeeded")
	}
	bad := &onnx.Tensor{Type: onnx.Float, Dims: []int64{1, 3}, Data: []float32{1, 2, 3}}
	if _, err := c.Infer(ctx, "affine", "", map[string]*onnx.Tensor{"x": bad}, nil, false); err == nil {
		t.Error("Infer with a wrong shape succeeded")
	}
	if _, err := c.Infer(ctx, "broken", "", map[string]*onnx.Tensor{"x": bad}, nil, false); err == nil {
		t.Error("Infer on a failing runner succeeded")
	}
	only := context.WithValue(ctx, responseOnlyKey{}, true)
	for _, body := range []string{`{"inputs": [`, `{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1]}]}`} {
		req, _ := http.NewRequestWithContext(only, http.MethodPost, e.hs.URL+"/v2/models/affine/infer", strings.NewReader(body))
		resp, err := (&http.Client{Transport: v}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: status %d, want 400", body, resp.StatusCode)
		}
	}
	t.Logf("validated %d exchanges; not in the schema: %v", v.checked, v.skipped)
	if v.checked < 19 {
		t.Errorf("validated %d exchanges, want at least 19", v.checked)
	}
	if want := map[string]bool{"POST /v2/repository/index": true}; !maps.Equal(v.skipped, want) {
		t.Errorf("calls outside the schema = %v, want %v", v.skipped, want)
	}
}

// The validator must catch what is wrong, or its silence proves nothing.
func TestOpenAPICatches(t *testing.T) {
	s := loadSchema(t)
	good := `{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`
	tests := []struct {
		name, reqBody, respBody string
		status                  int
	}{
		{"input without datatype", `{"inputs":[{"name":"x","shape":[1],"data":[1]}]}`, `{"model_name":"m","outputs":[]}`, 200},
		{"shape of strings", `{"inputs":[{"name":"x","shape":["1"],"datatype":"FP32","data":[1]}]}`, `{"model_name":"m","outputs":[]}`, 200},
		{"response without model_name", good, `{"outputs":[]}`, 200},
		{"output without data", good, `{"model_name":"m","outputs":[{"name":"y","shape":[1],"datatype":"FP32"}]}`, 200},
		{"error without error", good, `{"message":"x"}`, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v2/models/m/infer", strings.NewReader(tt.reqBody))
			req.Header.Set("Content-Type", "application/json")
			resp := &http.Response{StatusCode: tt.status, Header: http.Header{"Content-Type": {"application/json"}}}
			if err := s.check(req, []byte(tt.reqBody), resp, []byte(tt.respBody), false); err == nil {
				t.Errorf("check(%s -> %d %s) passed", tt.reqBody, tt.status, tt.respBody)
			}
		})
	}
}
