package ort

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/onnx"
	ortgo "github.com/yalue/onnxruntime_go"
)

// ErrNotInitialized is returned when a session is opened before Init.
var ErrNotInitialized = errors.New("ONNX Runtime is not initialized (call ort.Init first)")

// ErrClosed is returned by Run on a closed session.
var ErrClosed = errors.New("session is closed")

// IOInfo describes a model input or output as the session sees it.
type IOInfo struct {
	Name string
	// Kind is "tensor" for tensors; other kinds (sequence, map, optional)
	// are listed but cannot be fed or fetched.
	Kind string
	Type onnx.DataType
	// Ranked is false when the model does not record the rank; Dims is nil then.
	Ranked bool
	// Dims holds each dimension, -1 where it is not fixed.
	Dims []int64
	// Params holds the symbolic name of each dimension ("batch"), "" where the
	// dimension is fixed or unnamed.
	Params []string
}

func ioInfo(v onnx.ValueInfo) IOInfo {
	info := IOInfo{Name: v.Name, Kind: v.Kind, Type: v.Type, Ranked: v.Shape.Ranked}
	if v.Shape.Ranked {
		info.Dims = v.Shape.Static()
		info.Params = make([]string, len(v.Shape.Dims))
		for i, d := range v.Shape.Dims {
			info.Params[i] = d.Param
		}
	}
	return info
}

func (i IOInfo) static() bool {
	if !i.Ranked {
		return false
	}
	for _, d := range i.Dims {
		if d < 0 {
			return false
		}
	}
	return true
}

// fetch is one output ONNX Runtime is asked for.
type fetch struct {
	ortName string // the graph output passed to ONNX Runtime
	out     int    // index into Session.outputs
	widened bool   // ortName is a float32 cast of the output
	// input says the output is a graph input handed on as it is: ONNX
	// Runtime does not write such an output into a pre-allocated buffer,
	// so the session copies the input there itself.
	input bool
}

// Session is an ONNX Runtime inference session over one model.
//
// Run may be called from several goroutines at once: ONNX Runtime's Run is
// thread-safe, and every call has its own input and output buffers. Close
// waits for running calls to finish.
//
// Each Run computes every graph output (the binding fixes the fetched names
// when the session is created); outputs only selects what is returned.
type Session struct {
	name    string // for errors: the model path, or "model" for bytes
	mu      sync.RWMutex
	sess    *ortgo.DynamicAdvancedSession
	inputs  []IOInfo
	outputs []IOInfo
	inIdx   map[string]int
	outIdx  map[string]int
	fetches []fetch
	shapes  shapeCache // output shapes by input shapes, see outputs.go
	// inferred are ONNX Runtime's output shapes with
	// SessionOptions.InferOutputShapes (see infer.go), by output index.
	inferred []outShape
}

// NewSession opens a session on the model file at path. ONNX Runtime reads
// external data files next to the model itself.
func NewSession(path string, opts SessionOptions) (*Session, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("opening session for %s: %w", path, err)
	}
	m, err := onnx.LoadWith(path, onnx.LoadOptions{SkipExternalData: true})
	if err != nil {
		return nil, fmt.Errorf("opening session: %w", err)
	}
	var data []byte
	if widenList(m) != nil {
		// The model is rewritten in memory, so external data must be inlined.
		if m, err = onnx.Load(path); err != nil {
			return nil, fmt.Errorf("opening session: %w", err)
		}
		if data, err = m.Marshal(); err != nil {
			return nil, fmt.Errorf("opening session for %s: %w", path, err)
		}
	}
	s, err := open(path, m, data, path, opts)
	if err != nil {
		return nil, fmt.Errorf("opening session for %s: %w", path, err)
	}
	return s, nil
}

// NewSessionFromBytes opens a session on a serialized model. The model must
// not refer to external data files.
func NewSessionFromBytes(data []byte, opts SessionOptions) (*Session, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("opening session: %w", err)
	}
	m, err := onnx.Parse(data, "")
	if err != nil {
		return nil, fmt.Errorf("opening session: %w", err)
	}
	s, err := open("model", m, data, "", opts)
	if err != nil {
		return nil, fmt.Errorf("opening session: %w", err)
	}
	return s, nil
}

// widenList returns the outputs that must be fetched through a float32 cast.
func widenList(m *onnx.Model) []string {
	var names []string
	for _, o := range m.Outputs() {
		if needsWiden(o) {
			names = append(names, o.Name)
		}
	}
	return names
}

// open creates the ONNX Runtime session from data, or from path when data
// is nil. m is the parsed model; it is modified when outputs are widened.
func open(name string, m *onnx.Model, data []byte, path string, opts SessionOptions) (*Session, error) {
	if !Initialized() {
		return nil, ErrNotInitialized
	}
	s := &Session{name: name, inIdx: map[string]int{}, outIdx: map[string]int{}}
	for i, v := range m.Inputs() {
		s.inputs = append(s.inputs, ioInfo(v))
		s.inIdx[v.Name] = i
	}
	for i, v := range m.Outputs() {
		s.outputs = append(s.outputs, ioInfo(v))
		s.outIdx[v.Name] = i
	}
	if len(s.inputs) == 0 {
		return nil, errors.New("the model has no inputs, which the ONNX Runtime binding cannot run")
	}
	wide := widenList(m)
	if len(wide) > 0 && opts.OptimizedModelPath != "" {
		// Write the optimized model from the unmodified graph, so the
		// written file carries no helper outputs; the session that runs
		// is opened without the path.
		probe, err := create(data, path, nil, nil, opts)
		if err != nil {
			return nil, err
		}
		probe.Destroy()
		opts.OptimizedModelPath = ""
	}
	var hidden map[string]string
	if len(wide) > 0 {
		hidden = widen(m, wide)
		var err error
		if data, err = m.Marshal(); err != nil {
			return nil, err
		}
	}
	inNames := make([]string, len(s.inputs))
	for i, in := range s.inputs {
		inNames[i] = in.Name
	}
	var outNames []string
	for i, o := range s.outputs {
		_, isInput := s.inIdx[o.Name]
		f := fetch{ortName: o.Name, out: i, input: isInput}
		if h, ok := hidden[o.Name]; ok {
			f = fetch{ortName: h, out: i, widened: true}
		}
		s.fetches = append(s.fetches, f)
		outNames = append(outNames, f.ortName)
	}
	sess, err := create(data, path, inNames, outNames, opts)
	if err != nil {
		return nil, err
	}
	s.sess = sess
	if opts.InferOutputShapes {
		if err := s.inferShapes(data, path); err != nil {
			sess.Destroy()
			return nil, err
		}
	}
	return s, nil
}

func create(data []byte, path string, in, out []string, opts SessionOptions) (*ortgo.DynamicAdvancedSession, error) {
	so, err := opts.binding()
	if err != nil {
		return nil, err
	}
	defer so.Destroy()
	if data != nil {
		return ortgo.NewDynamicAdvancedSessionWithONNXData(data, in, out, so)
	}
	return ortgo.NewDynamicAdvancedSession(path, in, out, so)
}

// Inputs returns the inputs a caller must feed (graph inputs that are not
// initializers), in graph order.
func (s *Session) Inputs() []IOInfo { return append([]IOInfo(nil), s.inputs...) }

// Outputs returns the graph outputs in graph order.
func (s *Session) Outputs() []IOInfo { return append([]IOInfo(nil), s.outputs...) }

// Close releases the ONNX Runtime session. It waits for running calls and
// may be called more than once.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil {
		return nil
	}
	err := s.sess.Destroy()
	s.sess = nil
	return err
}

// Run feeds inputs (by input name; every input is required) and returns the
// named outputs, or every graph output when outputs is nil. The returned
// tensors own their data. Element types and fixed dimensions are checked
// against the model before ONNX Runtime sees them. Cancelling ctx stops a
// running model at the next operator boundary.
//
// Outputs of a run whose input shapes the session has seen before are
// written by ONNX Runtime straight into the Go memory of the result (see
// outputs.go); RunReuse also recycles that memory.
func (s *Session) Run(ctx context.Context, inputs map[string]*onnx.Tensor, outputs []string) (map[string]*onnx.Tensor, error) {
	return s.runChecked(ctx, inputs, outputs, nil)
}

func (s *Session) runChecked(ctx context.Context, inputs map[string]*onnx.Tensor, outputs []string, old map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("running %s: %w", s.name, err)
	}
	want, err := s.selectOutputs(outputs)
	if err != nil {
		return nil, fmt.Errorf("running %s: %w", s.name, err)
	}
	if err := s.checkInputs(inputs); err != nil {
		return nil, fmt.Errorf("running %s: %w", s.name, err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.sess == nil {
		return nil, fmt.Errorf("running %s: %w", s.name, ErrClosed)
	}
	res, err := s.run(ctx, inputs, want, old)
	if err != nil {
		return nil, fmt.Errorf("running %s: %w", s.name, err)
	}
	return res, nil
}

func (s *Session) selectOutputs(names []string) (map[string]bool, error) {
	want := map[string]bool{}
	if names == nil {
		for _, o := range s.outputs {
			want[o.Name] = true
		}
		return want, nil
	}
	for _, n := range names {
		i, ok := s.outIdx[n]
		if !ok {
			return nil, fmt.Errorf("output %q: not an output of the model (outputs: %s)", n, list(s.outputs))
		}
		if s.outputs[i].Kind != "tensor" {
			return nil, fmt.Errorf("output %q: is a %s; only tensors are supported", n, s.outputs[i].Kind)
		}
		want[n] = true
	}
	return want, nil
}

func list(infos []IOInfo) string {
	names := make([]string, len(infos))
	for i, v := range infos {
		names[i] = fmt.Sprintf("%q", v.Name)
	}
	return strings.Join(names, ", ")
}

func (s *Session) checkInputs(inputs map[string]*onnx.Tensor) error {
	var unknown []string
	for name := range inputs {
		if _, ok := s.inIdx[name]; !ok {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("input %q: not an input of the model (inputs: %s)", unknown[0], list(s.inputs))
	}
	for _, in := range s.inputs {
		t, ok := inputs[in.Name]
		if !ok || t == nil {
			return fmt.Errorf("input %q: missing", in.Name)
		}
		if err := checkInput(in, t); err != nil {
			return fmt.Errorf("input %q: %w", in.Name, err)
		}
	}
	return nil
}

func checkInput(in IOInfo, t *onnx.Tensor) error {
	if in.Kind != "tensor" {
		return fmt.Errorf("is a %s; only tensors are supported", in.Kind)
	}
	if in.Type != onnx.Undefined && t.Type != in.Type {
		return fmt.Errorf("element type %s, the model wants %s", t.Type, in.Type)
	}
	if !supported(t.Type) {
		return fmt.Errorf("%s: %w", t.Type, errUnsupported)
	}
	if err := checkData(t); err != nil {
		return err
	}
	if !in.Ranked {
		return nil
	}
	if len(t.Dims) != len(in.Dims) {
		return fmt.Errorf("shape %v has rank %d, the model wants rank %d %s", t.Dims, len(t.Dims), len(in.Dims), shapeString(in))
	}
	for i, d := range in.Dims {
		if d >= 0 && t.Dims[i] != d {
			return fmt.Errorf("shape %v: dimension %d is %d, the model fixes it to %d %s", t.Dims, i, t.Dims[i], d, shapeString(in))
		}
	}
	return nil
}

func shapeString(in IOInfo) string {
	parts := make([]string, len(in.Dims))
	for i, d := range in.Dims {
		switch {
		case d >= 0:
			parts[i] = fmt.Sprint(d)
		case in.Params[i] != "":
			parts[i] = in.Params[i]
		default:
			parts[i] = "?"
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// runORT runs the session, terminating it if ctx is cancelled meanwhile.
func (s *Session) runORT(ctx context.Context, in, out []ortgo.Value) error {
	if ctx.Done() == nil {
		return s.sess.Run(in, out)
	}
	ro, err := ortgo.NewRunOptions()
	if err != nil {
		return err
	}
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			ro.Terminate()
		}
	})
	err = s.sess.RunWithOptions(in, out, ro)
	mu.Lock()
	finished = true
	mu.Unlock()
	stop()
	ro.Destroy()
	if ctxErr := ctx.Err(); err != nil && ctxErr != nil {
		return ctxErr
	}
	return err
}

// ValueInfo returns the input or output in the form onnx and dataset use.
func (i IOInfo) ValueInfo() onnx.ValueInfo {
	v := onnx.ValueInfo{Name: i.Name, Kind: i.Kind, Type: i.Type, Shape: onnx.Shape{Ranked: i.Ranked}}
	for j, d := range i.Dims {
		dim := onnx.Dim{Known: d >= 0}
		if d >= 0 {
			dim.Value = d
		}
		if j < len(i.Params) {
			dim.Param = i.Params[j]
		}
		v.Shape.Dims = append(v.Shape.Dims, dim)
	}
	return v
}

// Runner is a session seen as a function of its inputs that returns every
// output: the form checks, timing loops and servers call (check.Runner).
// Close is the session's.
type Runner struct{ *Session }

// Run runs the session on inputs and returns every graph output.
func (r Runner) Run(ctx context.Context, inputs map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return r.Session.Run(ctx, inputs, nil)
}

// ValueInfos converts a session's inputs or outputs (IOInfo.ValueInfo).
func ValueInfos(infos []IOInfo) []onnx.ValueInfo {
	out := make([]onnx.ValueInfo, len(infos))
	for i, in := range infos {
		out[i] = in.ValueInfo()
	}
	return out
}
