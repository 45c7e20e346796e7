package kserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

// HTTPError is an error answer of a KServe v2 server.
type HTTPError struct {
	Status  int
	Message string // the "error" of the JSON body, else the body's start
	URL     string // the path called
}

// Error says which call got which answer: "/v2/models/m/infer: 400 Bad Request: ...".
func (e *HTTPError) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.URL, e.Status, http.StatusText(e.Status), e.Message)
}

// Client calls a KServe v2 REST server: kiln's own or Triton.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client of the server at baseURL
// ("http://localhost:8000"); hc nil means http.DefaultClient.
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: hc}
}

// modelPath is /v2/models/{model}[/versions/{version}].
func modelPath(model, version string) string {
	p := "/v2/models/" + url.PathEscape(model)
	if version != "" {
		p += "/versions/" + url.PathEscape(version)
	}
	return p
}

// call sends a request and returns the body of a 2xx answer.
func (c *Client) call(ctx context.Context, method, path string, body []byte, header http.Header) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the response: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return resp, out, &HTTPError{Status: resp.StatusCode, Message: errorMessage(out), URL: path}
	}
	return resp, out, nil
}

func errorMessage(body []byte) string {
	var eb errorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
		return eb.Error
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// getJSON calls GET path and decodes the answer into v.
func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	_, body, err := c.call(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: parsing the answer: %w", path, err)
	}
	return nil
}

// probe calls a health endpoint: 200 is true, another answer false, and
// only a failure to get an answer is an error.
func (c *Client) probe(ctx context.Context, path string) (bool, error) {
	_, _, err := c.call(ctx, http.MethodGet, path, nil, nil)
	var he *HTTPError
	if errors.As(err, &he) {
		if he.Status == http.StatusNotFound {
			return false, err
		}
		return false, nil
	}
	return err == nil, err
}

// Live reports whether the server is live (GET /v2/health/live).
func (c *Client) Live(ctx context.Context) (bool, error) { return c.probe(ctx, "/v2/health/live") }

// Ready reports whether the server is ready (GET /v2/health/ready).
func (c *Client) Ready(ctx context.Context) (bool, error) { return c.probe(ctx, "/v2/health/ready") }

// ModelReady reports whether a model version ("" for the server's choice)
// is ready; an unknown model is an *HTTPError with status 404.
func (c *Client) ModelReady(ctx context.Context, model, version string) (bool, error) {
	return c.probe(ctx, modelPath(model, version)+"/ready")
}

// ServerMetadata returns the server's name, version and extensions (GET /v2).
func (c *Client) ServerMetadata(ctx context.Context) (*ServerMetadata, error) {
	var md ServerMetadata
	if err := c.getJSON(ctx, "/v2", &md); err != nil {
		return nil, err
	}
	return &md, nil
}

// ModelMetadata returns a model version's metadata; version "" lets the
// server choose.
func (c *Client) ModelMetadata(ctx context.Context, model, version string) (*ModelMetadata, error) {
	var md ModelMetadata
	if err := c.getJSON(ctx, modelPath(model, version), &md); err != nil {
		return nil, err
	}
	return &md, nil
}

// RepositoryIndex lists the server's models (Triton's POST /v2/repository/index).
func (c *Client) RepositoryIndex(ctx context.Context) ([]RepositoryModel, error) {
	const path = "/v2/repository/index"
	_, body, err := c.call(ctx, http.MethodPost, path, []byte("{}"), http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		return nil, err
	}
	var out []RepositoryModel
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("POST %s: parsing the answer: %w", path, err)
	}
	return out, nil
}

// WaitReady polls GET /v2/health/ready every interval until the server is
// ready or ctx ends; connection errors while it starts are not fatal.
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(max(interval, time.Millisecond))
	defer t.Stop()
	var last error
	for {
		ok, err := c.Ready(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s to be ready: %w (last: %v)", c.base, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s to be ready: %w", c.base, ctx.Err())
		case <-t.C:
		}
	}
}

// Infer runs a model version on inputs and returns the outputs named (all
// when outputs is empty). With binary, inputs and outputs travel as binary
// tensor data, which keeps every bit (JSON cannot carry NaN, infinities or
// byte strings that are not UTF-8).
func (c *Client) Infer(ctx context.Context, model, version string, inputs map[string]*onnx.Tensor, outputs []string, binary bool) (map[string]*onnx.Tensor, error) {
	req := &Request{BinaryOutput: binary}
	names := make([]string, 0, len(inputs))
	for n := range inputs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := *inputs[n]
		t.Name = n
		req.Inputs = append(req.Inputs, &t)
	}
	for _, o := range outputs {
		req.Outputs = append(req.Outputs, OutputRequest{Name: o, Binary: binary})
	}
	resp, err := c.Do(ctx, model, version, req, binary)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*onnx.Tensor, len(resp.Outputs))
	for _, t := range resp.Outputs {
		out[t.Name] = t
	}
	return out, nil
}

// Do sends an inference request as it is, its inputs as binary data when
// binary is set, and returns the decoded response.
func (c *Client) Do(ctx context.Context, model, version string, req *Request, binary bool) (*Response, error) {
	path := modelPath(model, version) + "/infer"
	body, headerLen, err := EncodeRequest(req, binary)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if headerLen < len(body) {
		h.Set("Content-Type", "application/octet-stream")
		h.Set(HeaderContentLength, strconv.Itoa(headerLen))
	}
	resp, out, err := c.call(ctx, http.MethodPost, path, body, h)
	if err != nil {
		return nil, err
	}
	respLen := -1
	if v := resp.Header.Get(HeaderContentLength); v != "" {
		if respLen, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("POST %s: header %s %q: %w", path, HeaderContentLength, v, err)
		}
	}
	r, err := DecodeResponse(out, respLen)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	return r, nil
}

// RemoteRunner is a model on a KServe v2 server seen as a Runner.
type RemoteRunner struct {
	c              *Client
	model, version string
}

// ModelRunner returns a Runner that runs a model version on the server c
// calls, with binary tensor data so that outputs arrive bit for bit: a
// remote Triton can then be checked like a local model.
func ModelRunner(c *Client, model, version string) *RemoteRunner {
	return &RemoteRunner{c: c, model: model, version: version}
}

// Run implements Runner.
func (r *RemoteRunner) Run(ctx context.Context, inputs map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return r.c.Infer(ctx, r.model, r.version, inputs, nil, true)
}
