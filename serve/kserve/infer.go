package kserve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kiln-ml/kiln/onnx"
)

// handleInfer answers POST .../infer.
func (s *Server) handleInfer(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sv, err := s.lookup(r.PathValue("model"), r.PathValue("version"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.enter() {
		s.failInfer(w, r, sv, &apiError{status: http.StatusServiceUnavailable, reason: reasonRejected, err: errShuttingDown})
		return
	}
	defer s.inflight.Done()
	ctx, cancel := s.requestContext(r)
	defer cancel()
	body, headerLen, err := s.readAndInfer(ctx, w, r, sv)
	if err != nil {
		s.failInfer(w, r, sv, s.classify(ctx, sv, err))
		return
	}
	h := w.Header()
	if headerLen < len(body) {
		h.Set("Content-Type", "application/octet-stream")
		h.Set(HeaderContentLength, strconv.Itoa(headerLen))
	} else {
		h.Set("Content-Type", "application/json")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	sv.mm.success.Inc()
	addUS(sv.mm.requestUS, time.Since(start))
}

func (s *Server) failInfer(w http.ResponseWriter, r *http.Request, sv *served, err error) {
	reason := reasonOther
	var ae *apiError
	if errors.As(err, &ae) && ae.reason != "" {
		reason = ae.reason
	}
	sv.mm.failure[reason].Inc()
	s.fail(w, r, err)
}

// requestContext bounds a request by RequestTimeout and by a Shutdown
// whose deadline passed.
func (s *Server) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	var ctx context.Context
	var cancel context.CancelFunc
	if s.opts.RequestTimeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), s.opts.RequestTimeout)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() { stop(); cancel() }
}

// classify gives an error of an inference request its status and reason.
func (s *Server) classify(ctx context.Context, sv *served, err error) error {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return err
	case errors.Is(err, errShuttingDown):
		return &apiError{status: http.StatusServiceUnavailable, reason: reasonRejected, err: err}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &apiError{status: http.StatusServiceUnavailable, reason: reasonRejected,
			err: fmt.Errorf("model %s: request timed out after %s", sv.Name, s.opts.RequestTimeout)}
	case ctx.Err() != nil:
		return &apiError{status: http.StatusServiceUnavailable, reason: reasonCanceled,
			err: fmt.Errorf("model %s: request canceled: %w", sv.Name, context.Cause(ctx))}
	}
	var re *runError
	if errors.As(err, &re) {
		return &apiError{status: http.StatusInternalServerError, reason: reasonBackend,
			err: fmt.Errorf("running model %s version %s: %w", sv.Name, sv.Version, err)}
	}
	return &apiError{status: http.StatusInternalServerError, reason: reasonOther, err: err}
}

// readAndInfer takes a concurrency slot, reads the body and infers.
func (s *Server) readAndInfer(ctx context.Context, w http.ResponseWriter, r *http.Request, sv *served) ([]byte, int, error) {
	limit := s.opts.MaxRequestBytes
	if r.ContentLength > limit {
		return nil, 0, tooLarge(r.ContentLength, limit)
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, 0, &apiError{status: http.StatusServiceUnavailable, reason: reasonRejected,
				err: fmt.Errorf("server busy: %d inference requests in flight, waited %s", cap(s.slots), s.opts.RequestTimeout)}
		}
		return nil, 0, ctx.Err()
	}
	defer func() { <-s.slots }()
	buf := bytes.NewBuffer(make([]byte, 0, max(r.ContentLength, 0)+bytes.MinRead))
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, 0, tooLarge(-1, limit)
		}
		return nil, 0, badRequest(fmt.Errorf("reading the request body: %w", err))
	}
	headerLen := -1
	if v := r.Header.Get(HeaderContentLength); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, 0, badRequest(fmt.Errorf("header %s: %q is not a byte count", HeaderContentLength, v))
		}
		headerLen = n
	}
	return s.infer(ctx, sv, buf.Bytes(), headerLen)
}

func tooLarge(size, limit int64) error {
	what := "over"
	if size >= 0 {
		what = strconv.FormatInt(size, 10) + " bytes, over"
	}
	return &apiError{status: http.StatusRequestEntityTooLarge, reason: reasonOther,
		err: fmt.Errorf("request body is %s the limit of %d bytes", what, limit)}
}

// infer decodes a request body, runs it and encodes the response: all of
// an inference but HTTP.
func (s *Server) infer(ctx context.Context, sv *served, body []byte, headerLen int) ([]byte, int, error) {
	req, err := DecodeRequest(body, headerLen)
	if err != nil {
		return nil, 0, badRequest(err)
	}
	inputs, batch, err := sv.check(req)
	if err != nil {
		return nil, 0, badRequest(fmt.Errorf("model %s: %w", sv.Name, err))
	}
	outs, err := sv.sched.submit(ctx, inputs, batch)
	if err != nil {
		return nil, 0, err
	}
	resp, binary, err := sv.response(req, outs)
	if err != nil {
		return nil, 0, err
	}
	out, n, err := EncodeResponse(resp, binary)
	if err != nil {
		return nil, 0, &apiError{status: http.StatusInternalServerError, reason: reasonOther,
			err: fmt.Errorf("model %s: %w", sv.Name, err)}
	}
	return out, n, nil
}

// check validates a request against the model: every input present once,
// with the model's datatype and shape, one batch size for all, and known
// outputs. It returns the inputs by name and the batch size.
func (sv *served) check(req *Request) (map[string]*onnx.Tensor, int, error) {
	inputs := make(map[string]*onnx.Tensor, len(req.Inputs))
	batch, batchFrom := 1, ""
	for _, t := range req.Inputs {
		meta, ok := sv.inputs[t.Name]
		if !ok {
			return nil, 0, fmt.Errorf("unknown input %q (inputs are %s)", t.Name, names(sv.Inputs))
		}
		if t.Type != sv.types[t.Name] {
			got, _ := Datatype(t.Type)
			return nil, 0, fmt.Errorf("input %q: datatype %s, want %s", t.Name, got, meta.Datatype)
		}
		b, err := sv.checkShape(t.Dims, meta.Shape)
		if err != nil {
			return nil, 0, fmt.Errorf("input %q: %w", t.Name, err)
		}
		if batchFrom != "" && b != batch {
			return nil, 0, fmt.Errorf("input %q has batch size %d but input %q has %d", t.Name, b, batchFrom, batch)
		}
		batch, batchFrom = b, t.Name
		inputs[t.Name] = t
	}
	for _, m := range sv.Inputs {
		if inputs[m.Name] == nil {
			return nil, 0, fmt.Errorf("missing input %q", m.Name)
		}
	}
	for _, o := range req.Outputs {
		if _, ok := sv.outputs[o.Name]; !ok {
			return nil, 0, fmt.Errorf("unknown output %q (outputs are %s)", o.Name, names(sv.Outputs))
		}
		for _, p := range []string{"classification", "shared_memory_region"} {
			if _, ok := o.Parameters[p]; ok {
				return nil, 0, fmt.Errorf("output %q: parameter %s is not supported", o.Name, p)
			}
		}
	}
	return inputs, batch, nil
}

// checkShape checks dims against a model shape and returns the batch size.
func (sv *served) checkShape(dims, want []int64) (int, error) {
	full := want
	batch := 1
	if sv.MaxBatchSize > 0 {
		full = append([]int64{-1}, want...)
		if len(dims) == len(full) {
			if dims[0] < 1 || dims[0] > int64(sv.MaxBatchSize) {
				return 0, fmt.Errorf("batch size %d is not in [1,%d]", dims[0], sv.MaxBatchSize)
			}
			batch = int(dims[0])
		}
	}
	if len(dims) != len(full) {
		return 0, fmt.Errorf("shape %v has rank %d, want %d (shape %v)", dims, len(dims), len(full), full)
	}
	for i, d := range full {
		if d != -1 && dims[i] != d {
			return 0, fmt.Errorf("shape %v, want %v", dims, full)
		}
	}
	return batch, nil
}

// response picks the requested outputs (all, in model order, when none is
// named) and says which go as binary data.
func (sv *served) response(req *Request, outs map[string]*onnx.Tensor) (*Response, map[string]bool, error) {
	type want struct {
		name   string
		binary bool
	}
	var wants []want
	for _, o := range req.Outputs {
		wants = append(wants, want{o.Name, o.Binary})
	}
	if len(wants) == 0 {
		for _, m := range sv.Outputs {
			wants = append(wants, want{m.Name, req.BinaryOutput})
		}
	}
	resp := &Response{ModelName: sv.Name, ModelVersion: sv.Version, ID: req.ID, Outputs: make([]*onnx.Tensor, 0, len(wants))}
	binary := make(map[string]bool, len(wants))
	for _, wt := range wants {
		t := outs[wt.name]
		if t == nil {
			return nil, nil, &runError{fmt.Errorf("runner returned no output %q", wt.name)}
		}
		if t.Type != sv.types[wt.name] {
			return nil, nil, &runError{fmt.Errorf("runner returned %s for output %q, declared %s", t.Type, wt.name, sv.outputs[wt.name].Datatype)}
		}
		c := *t
		c.Name = wt.name
		resp.Outputs = append(resp.Outputs, &c)
		binary[wt.name] = wt.binary
	}
	return resp, binary, nil
}

func names(ts []TensorMeta) string {
	var b bytes.Buffer
	for i, t := range ts {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(t.Name))
	}
	return b.String()
}
