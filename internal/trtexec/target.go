package trtexec

import (
	"fmt"

	"github.com/kiln-ml/kiln/manifest"
)

// Target is what a variant's engine must run on. Zero fields accept any.
type Target struct {
	// ComputeCapability is the GPU architecture, "8.6" (also "86", "sm_86").
	ComputeCapability string
	// TRT is the TensorRT release: "10.3" accepts any 10.3.x.
	TRT *manifest.TRTSpec
}

// TargetMismatchError reports a GPU or TensorRT release that is not the
// target's. Engines only load on the TensorRT version and GPU architecture
// they were built for.
type TargetMismatchError struct {
	// What is "compute capability" or "TensorRT version".
	What      string
	Want, Got string
}

// Error says what the target wants and what the machine has.
func (e *TargetMismatchError) Error() string {
	return fmt.Sprintf("target wants %s %s, but this machine has %s", e.What, e.Want, e.Got)
}

// Validate checks the target's compute capability spelling.
func (t Target) Validate() error {
	if t.ComputeCapability == "" {
		return nil
	}
	if _, err := manifest.ParseComputeCapability(t.ComputeCapability); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	return nil
}

// Check refuses a GPU or TensorRT release that does not match the target.
// A zero gpu (unknown) is not checked against ComputeCapability.
func (t Target) Check(gpu GPU, v manifest.TRTVersion) error {
	if t.TRT != nil && !t.TRT.Match(v) {
		return &TargetMismatchError{What: "TensorRT version", Want: t.TRT.String(), Got: v.String()}
	}
	if t.ComputeCapability == "" || gpu.ComputeCapability == "" {
		return nil
	}
	want, err := manifest.ParseComputeCapability(t.ComputeCapability)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	got, err := manifest.ParseComputeCapability(gpu.ComputeCapability)
	if err != nil {
		return fmt.Errorf("GPU %s: %w", gpu.Name, err)
	}
	if want != got {
		name := got
		if gpu.Name != "" {
			name = got + " (" + gpu.Name + ")"
		}
		return &TargetMismatchError{What: "compute capability", Want: want, Got: name}
	}
	return nil
}
