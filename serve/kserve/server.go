package kserve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/internal/check"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kiln-ml/kiln/onnx"
)

// Runner runs a model on named input tensors and returns its outputs by
// name: kiln's one runner interface (check.Runner). With dynamic batching,
// inputs are stacked along dimension 0 and every output must keep that
// dimension. Run may be called concurrently up to the model's Instances.
type Runner = check.Runner

// Model is one model version a Server serves, described as Triton's
// config.pbtxt describes it.
type Model struct {
	Name     string
	Version  string // default "1"
	Platform string // reported in metadata, e.g. "onnxruntime_onnx"
	// MaxBatchSize > 0 means every input and output has a leading batch
	// dimension of 1 to MaxBatchSize that Inputs and Outputs leave out.
	MaxBatchSize int
	// MaxQueueDelay and PreferredBatchSizes turn on dynamic batching (with
	// MaxBatchSize > 0): a batch waits at most MaxQueueDelay for requests,
	// and goes as soon as it reaches the largest preferred size.
	MaxQueueDelay       time.Duration
	PreferredBatchSizes []int
	// Instances is how many Runner calls may run at once, like Triton's
	// instance_group count; default 1.
	Instances int
	// Inputs and Outputs give names, KServe datatypes and shapes, -1 for a
	// dimension of any size, without the batch dimension.
	Inputs, Outputs []TensorMeta
	Runner          Runner
}

// batching reports whether the model uses the dynamic batcher.
func (m *Model) batching() bool {
	return m.MaxBatchSize > 0 && (m.MaxQueueDelay > 0 || len(m.PreferredBatchSizes) > 0)
}

// Validate checks the model's description.
func (m *Model) Validate() error {
	switch {
	case m.Name == "":
		return errors.New("model has no name")
	case m.Runner == nil:
		return fmt.Errorf("model %s has no runner", m.Name)
	case m.MaxBatchSize < 0 || m.MaxQueueDelay < 0 || m.Instances < 0:
		return fmt.Errorf("model %s: negative max batch size, queue delay or instance count", m.Name)
	case len(m.Inputs) == 0 || len(m.Outputs) == 0:
		return fmt.Errorf("model %s needs inputs and outputs", m.Name)
	}
	for _, p := range m.PreferredBatchSizes {
		if p < 1 || p > m.MaxBatchSize {
			return fmt.Errorf("model %s: preferred batch size %d is not in [1,%d]", m.Name, p, m.MaxBatchSize)
		}
	}
	seen := map[string]bool{}
	for _, t := range slices.Concat(m.Inputs, m.Outputs) {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("model %s: tensor name %q is empty or used twice", m.Name, t.Name)
		}
		seen[t.Name] = true
		if _, err := ParseDatatype(t.Datatype); err != nil {
			return fmt.Errorf("model %s tensor %s: %w", m.Name, t.Name, err)
		}
		for _, d := range t.Shape {
			if d < -1 {
				return fmt.Errorf("model %s tensor %s: dimension %d", m.Name, t.Name, d)
			}
		}
	}
	return nil
}

// Options configure a Server. The zero value is ready to use.
type Options struct {
	// MaxConcurrency bounds the inference requests handled at once
	// (default 64); the rest wait, up to RequestTimeout, then get 503.
	MaxConcurrency int
	// MaxRequestBytes bounds request bodies (default 64 MiB); larger
	// ones get 413 without being read.
	MaxRequestBytes int64
	// RequestTimeout bounds an inference request from its arrival to its
	// result; zero means no bound but the client's.
	RequestTimeout time.Duration
	// Version is reported in the server metadata (default the module's
	// version from the build information).
	Version string
	// Logger gets one debug line per failed request; default discard.
	Logger *slog.Logger
	// Registerer gets the metrics; default a fresh registry.
	Registerer prometheus.Registerer
	// Gatherer is what MetricsHandler serves: default the Registerer when
	// it is also a Gatherer (a *prometheus.Registry).
	Gatherer prometheus.Gatherer
}

// Validate checks the options.
func (o *Options) Validate() error {
	if o.MaxConcurrency < 0 || o.MaxRequestBytes < 0 || o.RequestTimeout < 0 {
		return errors.New("server options: negative MaxConcurrency, MaxRequestBytes or RequestTimeout")
	}
	return nil
}

// DefaultMaxRequestBytes is the default bound of request bodies.
const DefaultMaxRequestBytes = 64 << 20

// served is a Model with what the server keeps for it.
type served struct {
	Model
	inputs  map[string]TensorMeta
	outputs map[string]TensorMeta
	types   map[string]onnx.DataType
	sched   scheduler
	mm      *modelMetrics
}

// Server serves models over the KServe v2 REST protocol.
type Server struct {
	opts     Options
	log      *slog.Logger
	versions map[string][]*served // by model name, highest version first
	slots    chan struct{}
	metrics  *metrics
	gatherer prometheus.Gatherer
	mux      *http.ServeMux
	base     context.Context // canceled when a Shutdown's deadline passes
	cancel   context.CancelFunc

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
	drained  chan struct{}
	once     sync.Once
}

// NewServer checks the models, registers the metrics and starts the
// models' schedulers.
func NewServer(models []Model, opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.MaxConcurrency = cmp.Or(opts.MaxConcurrency, 64)
	opts.MaxRequestBytes = cmp.Or(opts.MaxRequestBytes, DefaultMaxRequestBytes)
	opts.Version = cmp.Or(opts.Version, buildVersion())
	s := &Server{opts: opts, log: opts.Logger, versions: map[string][]*served{},
		slots: make(chan struct{}, opts.MaxConcurrency), drained: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	list, err := prepare(models)
	if err != nil {
		return nil, err
	}
	reg, gatherer := opts.Registerer, opts.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg = r
		if gatherer == nil {
			gatherer = r
		}
	}
	if g, ok := reg.(prometheus.Gatherer); ok && gatherer == nil {
		gatherer = g
	}
	s.gatherer = gatherer
	if s.metrics, err = newMetrics(reg); err != nil {
		return nil, err
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	for _, sv := range list {
		sv.mm = s.metrics.forModel(sv.Name, sv.Version)
		if sv.batching() {
			sv.sched = newBatcher(s.base, &sv.Model, sv.mm)
		} else {
			sv.sched = &direct{runner: sv.Runner, slots: make(chan struct{}, max(sv.Instances, 1)), mm: sv.mm}
		}
		s.versions[sv.Name] = append(s.versions[sv.Name], sv)
	}
	for _, vs := range s.versions {
		slices.SortFunc(vs, func(a, b *served) int { return compareVersions(b.Version, a.Version) })
	}
	s.mux = s.routes()
	return s, nil
}

// prepare validates the models and indexes their tensors, copying what
// the caller could change later.
func prepare(models []Model) ([]*served, error) {
	seen := map[[2]string]bool{}
	var out []*served
	for _, m := range models {
		if err := m.Validate(); err != nil {
			return nil, err
		}
		m.Version = cmp.Or(m.Version, "1")
		key := [2]string{m.Name, m.Version}
		if seen[key] {
			return nil, fmt.Errorf("model %s version %s is given twice", m.Name, m.Version)
		}
		seen[key] = true
		m.Inputs, m.Outputs = cloneMeta(m.Inputs), cloneMeta(m.Outputs)
		m.PreferredBatchSizes = slices.Clone(m.PreferredBatchSizes)
		sv := &served{Model: m, inputs: map[string]TensorMeta{}, outputs: map[string]TensorMeta{}, types: map[string]onnx.DataType{}}
		for _, t := range m.Inputs {
			sv.inputs[t.Name] = t
			sv.types[t.Name], _ = ParseDatatype(t.Datatype)
		}
		for _, t := range m.Outputs {
			sv.outputs[t.Name] = t
			sv.types[t.Name], _ = ParseDatatype(t.Datatype)
		}
		out = append(out, sv)
	}
	return out, nil
}

func cloneMeta(ts []TensorMeta) []TensorMeta {
	out := slices.Clone(ts)
	for i := range out {
		out[i].Shape = slices.Clone(out[i].Shape)
	}
	return out
}

// compareVersions orders versions: numbers by value and above any other
// name, so that the highest number is the latest version.
func compareVersions(a, b string) int {
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(x, y)
	case errA == nil:
		return 1
	case errB == nil:
		return -1
	}
	return cmp.Compare(a, b)
}

func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Handler returns the handler of the protocol's endpoints.
func (s *Server) Handler() http.Handler { return s.mux }

// MetricsHandler returns the handler of the Prometheus metrics endpoint
// (Triton serves it on its own port, at /metrics).
func (s *Server) MetricsHandler() http.Handler {
	if s.gatherer == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "no metrics: the Registerer is not a Gatherer and no Gatherer was given")
		})
	}
	return promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{})
}

// enter counts an inference request in, unless the server is shutting down.
func (s *Server) enter() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	s.inflight.Add(1)
	return true
}

func (s *Server) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// Shutdown stops taking inference requests (they get 503, and readiness
// turns false), lets those under way and those queued in the batchers
// finish, and returns when they have; if ctx ends first, it cancels the
// runs still going and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.once.Do(func() {
		go func() {
			s.inflight.Wait()
			s.drainAll()
			close(s.drained)
		}()
	})
	select {
	case <-s.drained:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.cancel()
		return fmt.Errorf("shutting down the KServe server: %w", ctx.Err())
	}
}

// Close is Shutdown without a deadline.
func (s *Server) Close() error { return s.Shutdown(context.Background()) }

func (s *Server) drainAll() {
	for _, vs := range s.versions {
		for _, sv := range vs {
			if sv.sched != nil {
				sv.sched.drain()
			}
		}
	}
}

// lookup finds a model version; version "" is the highest.
func (s *Server) lookup(name, version string) (*served, error) {
	vs := s.versions[name]
	if len(vs) == 0 {
		return nil, &apiError{status: http.StatusNotFound, err: fmt.Errorf("unknown model %q", name)}
	}
	if version == "" {
		return vs[0], nil
	}
	for _, sv := range vs {
		if sv.Version == version {
			return sv, nil
		}
	}
	return nil, &apiError{status: http.StatusNotFound, err: fmt.Errorf("unknown version %q of model %q", version, name)}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}
