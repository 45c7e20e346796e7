package trtexec

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
)

// The nvidia-smi outputs below are written by hand in nvidia-smi's
// documented CSV format (nvidia-smi --help-query-gpu: one line per GPU,
// fields in query order separated by ", "; "nounits" drops " MiB"); they
// are not captured from a machine.
const (
	smiTwoGPUs = "0, NVIDIA A100-SXM4-80GB, GPU-4d1d5c7a-1b3c-4f5e-9a8b-0c1d2e3f4a5b, 8.0, 535.104.05, 81920\n" +
		"1, NVIDIA A100-SXM4-80GB, GPU-5e2e6d8b-2c4d-5a6f-0b9c-1d2e3f4a5b6c, 8.0, 535.104.05, 81920\n"
	smiWithUnits = "0, NVIDIA GeForce RTX 3090, GPU-0a1b2c3d-0000-1111-2222-333344445555, 8.6, 550.54.14, 24576 MiB\n"
	smiHeader    = "+---------------------------------------------------------------------------------------+\n" +
		"| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |\n"
)

func TestParseGPUCSV(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []GPU
		wantErr string
	}{
		{"two A100", smiTwoGPUs, []GPU{
			{Index: 0, Name: "NVIDIA A100-SXM4-80GB", UUID: "GPU-4d1d5c7a-1b3c-4f5e-9a8b-0c1d2e3f4a5b", ComputeCapability: "8.0", Driver: "535.104.05", MemoryMiB: 81920},
			{Index: 1, Name: "NVIDIA A100-SXM4-80GB", UUID: "GPU-5e2e6d8b-2c4d-5a6f-0b9c-1d2e3f4a5b6c", ComputeCapability: "8.0", Driver: "535.104.05", MemoryMiB: 81920},
		}, ""},
		{"with units", smiWithUnits, []GPU{
			{Index: 0, Name: "NVIDIA GeForce RTX 3090", UUID: "GPU-0a1b2c3d-0000-1111-2222-333344445555", ComputeCapability: "8.6", Driver: "550.54.14", MemoryMiB: 24576},
		}, ""},
		{"empty", "", nil, ""},
		{"old driver without compute_cap", "0, Tesla T4, GPU-1, [N/A], 470.82.01, 15360\n", nil, `compute capability "[N/A]"`},
		{"wrong field count", "0, Tesla T4, 7.5\n", nil, "wrong number of fields"},
		{"bad memory", "0, Tesla T4, GPU-1, 7.5, 470.82.01, lots\n", nil, `memory "lots"`},
	}
	for _, tt := range tests {
		got, err := ParseGPUCSV(strings.NewReader(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseGPUCSV(%s) error = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || mustJSON(t, got) != mustJSON(t, tt.want) {
			t.Errorf("ParseGPUCSV(%s) = %+v, %v, want %+v", tt.name, got, err, tt.want)
		}
	}
	if got := ParseCUDAVersion(smiHeader); got != "12.2" {
		t.Errorf("ParseCUDAVersion(header) = %q, want 12.2", got)
	}
}

// smiDouble is a TEST DOUBLE for nvidia-smi: an execx.Runner that answers
// the CSV query and the plain header with canned output.
type smiDouble struct {
	csv, header string
	err         error
	calls       [][]string
}

func (d *smiDouble) Run(_ context.Context, c execx.Cmd) (*execx.Result, error) {
	d.calls = append(d.calls, append([]string{c.Path}, c.Args...))
	if d.err != nil {
		return &execx.Result{ExitCode: 9, StdoutTail: d.header}, d.err
	}
	if len(c.Args) == 0 {
		return &execx.Result{StdoutTail: d.header}, nil
	}
	return &execx.Result{StdoutTail: d.csv}, nil
}

func TestQueryGPUs(t *testing.T) {
	d := &smiDouble{csv: smiWithUnits, header: smiHeader}
	gpus, err := QueryGPUs(context.Background(), d, "")
	if err != nil || len(gpus) != 1 || gpus[0].CUDA != "12.2" || gpus[0].ComputeCapability != "8.6" {
		t.Fatalf("QueryGPUs = %+v, %v, want one RTX 3090 with CUDA 12.2", gpus, err)
	}
	want := "nvidia-smi --query-gpu=index,name,uuid,compute_cap,driver_version,memory.total --format=csv,noheader,nounits"
	if got := strings.Join(d.calls[0], " "); got != want {
		t.Errorf("QueryGPUs ran %q, want %q", got, want)
	}

	// No driver: nvidia-smi exits 9 with its well-known message.
	noDriver := &smiDouble{header: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
		err: &execx.ToolError{Tool: "nvidia-smi", ExitCode: 9}}
	if _, err := QueryGPUs(context.Background(), noDriver, ""); !errors.Is(err, ErrNoGPU) {
		t.Errorf("QueryGPUs(no driver) error = %v, want ErrNoGPU", err)
	}
	if _, err := QueryGPUs(context.Background(), &smiDouble{header: smiHeader}, ""); !errors.Is(err, ErrNoGPU) {
		t.Errorf("QueryGPUs(no devices listed) error = %v, want ErrNoGPU", err)
	}
	// No nvidia-smi at all, through the real runner.
	_, err = QueryGPUs(context.Background(), execx.Exec{}, filepath.Join(t.TempDir(), "nvidia-smi"))
	if !errors.Is(err, ErrNoGPU) {
		t.Errorf("QueryGPUs(missing nvidia-smi) error = %v, want ErrNoGPU", err)
	}
}

func TestTargetCheck(t *testing.T) {
	v103 := manifest.TRTSpec{TRTVersion: manifest.TRTVersion{Major: 10, Minor: 3}, AnyPatch: true}
	a100 := GPU{Name: "NVIDIA A100-SXM4-80GB", ComputeCapability: "8.0"}
	tests := []struct {
		name   string
		target Target
		gpu    GPU
		v      manifest.TRTVersion
		want   string
	}{
		{"empty target", Target{}, a100, trt103, ""},
		{"match", Target{ComputeCapability: "8.0", TRT: &v103}, a100, manifest.TRTVersion{Major: 10, Minor: 3, Patch: 1}, ""},
		{"sm_80 spelling", Target{ComputeCapability: "sm_80"}, a100, trt103, ""},
		{"cc mismatch", Target{ComputeCapability: "8.6"}, a100, trt103,
			"target wants compute capability 8.6, but this machine has 8.0 (NVIDIA A100-SXM4-80GB)"},
		{"trt mismatch", Target{TRT: &v103}, a100, manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1},
			"target wants TensorRT version 10.3, but this machine has 10.16.1"},
		{"unknown gpu is not checked", Target{ComputeCapability: "8.6"}, GPU{}, trt103, ""},
		{"bad target", Target{ComputeCapability: "ampere"}, a100, trt103, `target: compute capability "ampere"`},
	}
	for _, tt := range tests {
		err := tt.target.Check(tt.gpu, tt.v)
		if tt.want == "" {
			if err != nil {
				t.Errorf("Target(%s).Check = %v, want nil", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("Target(%s).Check = %v, want %q", tt.name, err, tt.want)
		}
	}
	var tm *TargetMismatchError
	if err := (Target{ComputeCapability: "8.6"}).Check(a100, trt103); !errors.As(err, &tm) || tm.What != "compute capability" {
		t.Errorf("Check mismatch error = %v, want *TargetMismatchError", err)
	}
}
