package trtexec

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/manifest"
)

// ErrNoGPU reports a machine without a usable NVIDIA GPU: no nvidia-smi, no
// driver, or no device.
var ErrNoGPU = errors.New("no NVIDIA GPU found")

// GPU describes one GPU, for the provenance of the engines built on it.
type GPU struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid,omitempty"`
	// ComputeCapability is "major.minor", like "8.6".
	ComputeCapability string `json:"compute_capability"`
	Driver            string `json:"driver"`
	MemoryMiB         int    `json:"memory_mib"`
	// CUDA is the highest CUDA version the driver supports ("12.4"), from
	// the nvidia-smi header; empty when unknown.
	CUDA string `json:"cuda,omitempty"`
}

// gpuQueryFields are the nvidia-smi --query-gpu fields QueryGPUs asks for,
// in order (nvidia-smi --help-query-gpu; compute_cap needs driver 510+).
var gpuQueryFields = []string{"index", "name", "uuid", "compute_cap", "driver_version", "memory.total"}

// QueryGPUs lists the GPUs nvidia-smi sees, in index order. nvidia-smi is
// run by the name "nvidia-smi" unless smi is set. A machine without
// nvidia-smi, driver or devices gives an error wrapping ErrNoGPU.
func QueryGPUs(ctx context.Context, r execx.Runner, smi string) ([]GPU, error) {
	if r == nil {
		r = execx.Exec{}
	}
	if smi == "" {
		smi = "nvidia-smi"
	}
	res, err := r.Run(ctx, execx.Cmd{Path: smi, Args: []string{
		"--query-gpu=" + strings.Join(gpuQueryFields, ","), "--format=csv,noheader,nounits"}})
	if err != nil {
		return nil, smiError(err, res)
	}
	gpus, err := ParseGPUCSV(strings.NewReader(res.StdoutTail))
	if err != nil {
		return nil, err
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("nvidia-smi listed no devices: %w", ErrNoGPU)
	}
	// The CUDA version is only in the human-readable header; it is a
	// nice-to-have, so a failure here is not an error.
	if res, err := r.Run(ctx, execx.Cmd{Path: smi}); err == nil {
		if cuda := ParseCUDAVersion(res.StdoutTail); cuda != "" {
			for i := range gpus {
				gpus[i].CUDA = cuda
			}
		}
	}
	return gpus, nil
}

// smiError maps nvidia-smi failures that mean "no GPU here" to ErrNoGPU.
func smiError(err error, res *execx.Result) error {
	var nf *execx.NotFoundError
	if errors.As(err, &nf) {
		return fmt.Errorf("%w: %v", ErrNoGPU, err)
	}
	if res != nil {
		out := res.StdoutTail + res.StderrTail
		// Messages of nvidia-smi without devices or driver.
		for _, s := range []string{"No devices were found", "couldn't communicate with the NVIDIA driver"} {
			if strings.Contains(out, s) {
				return fmt.Errorf("%w: nvidia-smi: %s", ErrNoGPU, s)
			}
		}
	}
	return fmt.Errorf("querying GPUs: %w", err)
}

// ParseGPUCSV parses the output of
//
//	nvidia-smi --query-gpu=index,name,uuid,compute_cap,driver_version,memory.total --format=csv,noheader[,nounits]
//
// one GPU per line. Memory may carry the " MiB" unit (without nounits).
func ParseGPUCSV(r io.Reader) ([]GPU, error) {
	cr := csv.NewReader(r)
	cr.TrimLeadingSpace = true
	cr.FieldsPerRecord = len(gpuQueryFields)
	var gpus []GPU
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return gpus, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi output: %w", err)
		}
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
		g := GPU{Name: rec[1], UUID: rec[2], Driver: rec[4]}
		if g.Index, err = strconv.Atoi(rec[0]); err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi output: GPU index %q is not a number", rec[0])
		}
		if g.ComputeCapability, err = manifest.ParseComputeCapability(rec[3]); err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi output: GPU %d: %w", g.Index, err)
		}
		mem := strings.TrimSpace(strings.TrimSuffix(rec[5], "MiB"))
		if g.MemoryMiB, err = strconv.Atoi(mem); err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi output: GPU %d memory %q is not a number of MiB", g.Index, rec[5])
		}
		if g.Name == "" {
			return nil, fmt.Errorf("parsing nvidia-smi output: GPU %d has no name", g.Index)
		}
		gpus = append(gpus, g)
	}
}

var cudaRE = regexp.MustCompile(`CUDA Version: ([0-9]+\.[0-9]+)`)

// ParseCUDAVersion finds "CUDA Version: 12.4" in nvidia-smi's header.
func ParseCUDAVersion(out string) string {
	if m := cudaRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}
