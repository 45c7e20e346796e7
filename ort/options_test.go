package ort

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

func TestSessionOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts SessionOptions
		want string // "" for valid
	}{
		{"zero value", SessionOptions{}, ""},
		{"cuda on device 1", SessionOptions{Provider: ProviderCUDA, DeviceID: 1, OptLevel: OptBasic}, ""},
		{"tensorrt", SessionOptions{Provider: ProviderTensorRT, IntraOpThreads: 4, InterOpThreads: 2}, ""},
		{"negative intra", SessionOptions{IntraOpThreads: -1}, "intra-op threads -1"},
		{"negative inter", SessionOptions{InterOpThreads: -2}, "inter-op threads -2"},
		{"bad level", SessionOptions{OptLevel: OptLevel(7)}, "optimization level 7"},
		{"bad provider", SessionOptions{Provider: "rocm"}, `provider "rocm"`},
		{"device for cpu", SessionOptions{DeviceID: 1}, "device ID 1 given for the cpu provider"},
		{"negative device", SessionOptions{Provider: ProviderCUDA, DeviceID: -1}, "device ID -1"},
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
	for in, want := range map[string]OptLevel{"all": OptAll, "99": OptAll, "disabled": OptDisabled, "0": OptDisabled,
		"Basic": OptBasic, "extended": OptExtended} {
		if got, err := ParseOptLevel(in); err != nil || got != want {
			t.Errorf("ParseOptLevel(%q) = %v, %v, want %v", in, got, err, want)
		}
		if got, _ := ParseOptLevel(want.String()); got != want {
			t.Errorf("ParseOptLevel(%v.String()) = %v", want, got)
		}
	}
	if _, err := ParseOptLevel("max"); err == nil {
		t.Error(`ParseOptLevel("max") succeeded`)
	}
}

// TestProviderUnavailable asks the CPU-only library for GPU providers.
func TestProviderUnavailable(t *testing.T) {
	initORT(t)
	model := identityModel(t, "Identity", onnx.Float, onnx.Float, static2x3)
	for _, p := range []Provider{ProviderCUDA, ProviderTensorRT} {
		t.Run(string(p), func(t *testing.T) {
			s, err := NewSessionFromBytes(model, SessionOptions{Provider: p})
			if err == nil {
				s.Close()
				t.Skipf("this ONNX Runtime library has the %s provider", p)
			}
			var pe *ProviderUnavailableError
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
