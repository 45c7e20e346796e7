package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve/kserve"
)

// Endpoint serves a repository's ONNX models over the KServe v2 protocol,
// each with its config's max_batch_size, dynamic batching and instance
// count. TensorRT plans are not served: trtexec is no server (Triton is).
type Endpoint struct {
	*kserve.Server
	// Served and Skipped name the models, Skipped with the reason.
	Served  []string
	Skipped map[string]string
	closers []func() error
}

// NewEndpoint opens every ONNX model of the repository dir (only those
// named in models, when given) with ONNX Runtime and returns a server for
// them.
func NewEndpoint(dir string, models []string, so ort.SessionOptions, opts kserve.Options, log *slog.Logger) (*Endpoint, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	repo, err := readRepository(dir, models)
	if err != nil {
		return nil, err
	}
	e := &Endpoint{Skipped: map[string]string{}}
	var served []kserve.Model
	for _, a := range repo.artifacts {
		if a.Platform != pbtxt.PlatformONNX {
			e.Skipped[a.Name] = "a " + a.Platform + " model needs Triton to serve it"
			continue
		}
		m, closeFn, err := kserveModel(a, so)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("serving %s: %w", a.Name, err)
		}
		e.closers = append(e.closers, closeFn)
		served = append(served, m)
		e.Served = append(e.Served, a.Name)
	}
	for name, why := range e.Skipped {
		log.Warn("not serving "+name, "reason", why)
	}
	if len(served) == 0 {
		e.Close()
		return nil, fmt.Errorf("repository %s has no ONNX model kiln can serve", dir)
	}
	if e.Server, err = kserve.NewServer(served, opts); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close stops the server's batchers and closes the sessions.
func (e *Endpoint) Close() error {
	var errs []error
	if e.Server != nil {
		errs = append(errs, e.Server.Close())
	}
	for _, c := range e.closers {
		errs = append(errs, c())
	}
	e.closers = nil
	return errors.Join(errs...)
}

// kserveModel opens a's session and describes it as the server needs.
func kserveModel(a Artifact, so ort.SessionOptions) (kserve.Model, func() error, error) {
	s, err := ort.NewSession(a.Path, so)
	if err != nil {
		return kserve.Model{}, nil, err
	}
	m := kserve.Model{Name: a.Name, Version: strconv.FormatInt(max(a.Version, 1), 10), Platform: a.Platform, MaxBatchSize: a.MaxBatch,
		MaxQueueDelay: a.MaxQueueDelay, PreferredBatchSizes: a.PreferredBatch, Instances: max(a.Instances, 1), Runner: ort.Runner{Session: s}}
	if m.Inputs, err = tensorMetas(s.Inputs(), a.MaxBatch > 0); err == nil {
		m.Outputs, err = tensorMetas(s.Outputs(), a.MaxBatch > 0)
	}
	if err != nil {
		s.Close()
		return kserve.Model{}, nil, err
	}
	return m, s.Close, nil
}

// tensorMetas describes a session's tensors, without the batch dimension
// when the model batches.
func tensorMetas(infos []ort.IOInfo, batched bool) ([]kserve.TensorMeta, error) {
	out := make([]kserve.TensorMeta, len(infos))
	for i, in := range infos {
		dt, err := kserve.Datatype(in.Type)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", in.Name, err)
		}
		dims := in.Dims
		if batched && len(dims) > 0 {
			dims = dims[1:]
		}
		out[i] = kserve.TensorMeta{Name: in.Name, Datatype: dt, Shape: append([]int64{}, dims...)}
	}
	return out, nil
}

// Triton checks artifacts on a running KServe v2 server (Triton, or kiln's
// own endpoint) over HTTP: the model of the artifact's name and version
// must be ready there.
type Triton struct {
	Client *kserve.Client
}

// Open checks that the server has the model ready.
func (t Triton) Open(ctx context.Context, a Artifact) (Session, error) {
	v := ""
	if a.Version > 0 {
		v = strconv.FormatInt(a.Version, 10)
	}
	ready, err := t.Client.ModelReady(ctx, a.Name, v)
	switch {
	case err != nil:
		return nil, &LoadError{Artifact: a.Name, Err: fmt.Errorf("asking the server whether it is ready: %w", err)}
	case !ready:
		return nil, &LoadError{Artifact: a.Name, Err: errors.New("the server does not have it ready (not loaded, or failed to load: see the server's log)")}
	}
	return remoteSession{kserve.ModelRunner(t.Client, a.Name, v)}, nil
}

type remoteSession struct{ *kserve.RemoteRunner }

func (remoteSession) Close() error { return nil }
