package ort_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

func TestSessionOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts ort.SessionOptions
		want string // "" for valid
	}{
		{"zero value", ort.SessionOptions{}, ""},
		{"cuda on device 1", ort.SessionOptions{Provider: ort.ProviderCUDA, DeviceID: 1, OptLevel: ort.OptBasic}, ""},
		{"tensorrt", ort.SessionOptions{Provider: ort.ProviderTensorRT, IntraOpThreads: 4, InterOpThreads: 2}, ""},
		{"negative intra", ort.SessionOptions{IntraOpThreads: -1}, "intra-op threads -1"},
		{"negative inter", ort.SessionOptions{InterOpThreads: -2}, "inter-op threads -2"},
		{"bad level", ort.SessionOptions{OptLevel: ort.OptLevel(7)}, "optimization level 7"},
		{"bad provider", ort.SessionOptions{Provider: "rocm"}, `provider "rocm"`},
		{"device for cpu", ort.SessionOptions{DeviceID: 1}, "device ID 1 given for the cpu provider"},
		{"negative device", ort.SessionOptions{Provider: ort.ProviderCUDA, DeviceID: -1}, "device ID -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseOptLevel(t *testing.T) {
	for in, want := range map[string]ort.OptLevel{"all": ort.OptAll, "99": ort.OptAll, "disabled": ort.OptDisabled, "0": ort.OptDisabled,
		"Basic": ort.OptBasic, "extended": ort.OptExtended} {
		if got, err := ort.ParseOptLevel(in); err != nil || got != want {
			t.Errorf("ParseOptLevel(%q) = %v, %v, want %v", in, got, err, want)
		}
		if got, _ := ort.ParseOptLevel(want.String()); got != want {
			t.Errorf("ParseOptLevel(%v.String()) = %v", want, got)
		}
	}
	if _, err := ort.ParseOptLevel("max"); err == nil {
		t.Error(`ParseOptLevel("max") succeeded`)
	}
}

// TestProviderUnavailable asks the CPU-only library for GPU providers.
func TestProviderUnavailable(t *testing.T) {
	ortest.Init(t)
	model := identityModel(t, "Identity", onnx.Float, onnx.Float, static2x3)
	for _, p := range []ort.Provider{ort.ProviderCUDA, ort.ProviderTensorRT} {
		t.Run(string(p), func(t *testing.T) {
			s, err := ort.NewSessionFromBytes(model, ort.SessionOptions{Provider: p})
			if err == nil {
				s.Close()
				t.Skipf("this ONNX Runtime library has the %s provider", p)
			}
			var pe *ort.ProviderUnavailableError
			if !errors.As(err, &pe) || pe.Provider != p {
				t.Fatalf("NewSessionFromBytes(%s) = %v, want *ProviderUnavailableError", p, err)
			}
			if !strings.Contains(err.Error(), "GPU build") {
				t.Errorf("error %q does not say a GPU build is needed", err)
			}
			t.Log(err)
		})
	}
}

// TestNoSpinning runs a session whose threads sleep while they wait: ONNX
// Runtime takes both configuration entries, and the run computes as with
// spinning threads.
func TestNoSpinning(t *testing.T) {
	ortest.Init(t)
	model := identityModel(t, "Relu", onnx.Float, onnx.Float, static2x3)
	s, err := ort.NewSessionFromBytes(model, ort.SessionOptions{IntraOpThreads: 2, NoSpinning: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := &onnx.Tensor{Name: "x", Type: onnx.Float, Dims: []int64{2, 3}, Data: []float32{-1, 2, -3, 4, -5, 6}}
	out, err := s.Run(t.Context(), map[string]*onnx.Tensor{"x": in}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out["y"].Data.([]float32), []float32{0, 2, 0, 4, 0, 6}; !slices.Equal(got, want) {
		t.Errorf("Relu = %v, want %v", got, want)
	}
}
