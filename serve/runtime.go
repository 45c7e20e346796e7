package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// Artifact is one model to check: a Triton model of a repository, or a
// model file given alone.
type Artifact struct {
	// Name is the Triton model name (the file name for a model file).
	Name    string
	Version int64
	// Platform is Triton's platform: onnxruntime_onnx or tensorrt_plan.
	Platform string
	// Path is the model file.
	Path    string
	Size    int64
	Variant manifest.Variant
	// Source is the digest of the model the artifact was made from
	// (kiln.json), which picks its fp32 reference.
	Source manifest.Digest
	// MaxBatch is the config's max_batch_size (0: no batching).
	MaxBatch int
	// MaxQueueDelay and PreferredBatch are the config's dynamic batching
	// (zero without it); Instances its instance count.
	MaxQueueDelay  time.Duration
	PreferredBatch []int
	Instances      int
	// Inputs and Outputs are the signature the config and kiln.json give.
	Inputs, Outputs []onnx.ValueInfo
}

// Session is a loaded artifact.
type Session interface {
	check.Runner
	Close() error
}

// Runtime loads artifacts of the platforms it runs.
type Runtime interface {
	// Open loads the artifact. An *UnavailableError says the runtime
	// cannot run here (no GPU, no trtexec) and nothing was judged.
	Open(ctx context.Context, a Artifact) (Session, error)
}

// UnavailableError says that an artifact could not be checked on this
// machine because what runs it is missing.
type UnavailableError struct {
	Artifact string
	Reason   string // "needs GPU/TensorRT (trtexec not found)"
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s not checked: %s", e.Artifact, e.Reason)
}

// LoadError says that an artifact did not load: the artifact is broken
// (or its runtime refuses it), which fails the check.
type LoadError struct {
	Artifact string
	Err      error
}

func (e *LoadError) Error() string { return fmt.Sprintf("loading %s: %v", e.Artifact, e.Err) }

// Unwrap returns the runtime's error.
func (e *LoadError) Unwrap() error { return e.Err }

// ORT runs ONNX models with ONNX Runtime.
type ORT struct {
	Options ort.SessionOptions
}

// Open opens an ONNX Runtime session on the artifact's model file. A
// provider the library lacks is an *UnavailableError.
func (r ORT) Open(_ context.Context, a Artifact) (Session, error) {
	s, err := ort.NewSession(a.Path, r.Options)
	if err != nil {
		var pe *ort.ProviderUnavailableError
		if errors.As(err, &pe) {
			return nil, &UnavailableError{Artifact: a.Name, Reason: fmt.Sprintf("needs ONNX Runtime with the %s execution provider: %v", pe.Provider, pe.Err)}
		}
		return nil, &LoadError{Artifact: a.Name, Err: err}
	}
	return ort.Runner{Session: s}, nil
}
