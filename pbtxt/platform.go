package pbtxt

import (
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// Platforms and backends Triton knows (core src/constants.h).
const (
	PlatformTensorRT   = "tensorrt_plan"
	PlatformONNX       = "onnxruntime_onnx"
	PlatformSavedModel = "tensorflow_savedmodel"
	PlatformGraphDef   = "tensorflow_graphdef"
	PlatformTorch      = "pytorch_libtorch"
	PlatformEnsemble   = "ensemble"

	BackendTensorRT   = "tensorrt"
	BackendONNX       = "onnxruntime"
	BackendTensorFlow = "tensorflow"
	BackendPyTorch    = "pytorch"
	BackendPython     = "python"
	BackendOpenVINO   = "openvino"
)

// ConfigFile is the name of a model's configuration file.
const ConfigFile = "config.pbtxt"

// platformBackend maps each platform to the backend that serves it.
var platformBackend = map[string]string{
	PlatformTensorRT:   BackendTensorRT,
	PlatformONNX:       BackendONNX,
	PlatformSavedModel: BackendTensorFlow,
	PlatformGraphDef:   BackendTensorFlow,
	PlatformTorch:      BackendPyTorch,
	PlatformEnsemble:   "",
}

// defaultFiles maps platforms and backends to the default model file name in
// a version directory.
var defaultFiles = map[string]string{
	PlatformTensorRT:   "model.plan",
	PlatformONNX:       "model.onnx",
	PlatformSavedModel: "model.savedmodel",
	PlatformGraphDef:   "model.graphdef",
	PlatformTorch:      "model.pt",
	BackendTensorRT:    "model.plan",
	BackendONNX:        "model.onnx",
	BackendTensorFlow:  "model.savedmodel",
	BackendPyTorch:     "model.pt",
	BackendPython:      "model.py",
	BackendOpenVINO:    "model.xml",
}

// platformOfFile is how Triton's auto-complete picks a platform when a config
// names neither platform nor backend: by the file in the version directory.
var platformOfFile = []struct{ file, platform, backend string }{
	{"model.plan", PlatformTensorRT, BackendTensorRT},
	{"model.onnx", PlatformONNX, BackendONNX},
	{"model.pt", PlatformTorch, BackendPyTorch},
	{"model.savedmodel", PlatformSavedModel, BackendTensorFlow},
	{"model.graphdef", PlatformGraphDef, BackendTensorFlow},
	{"model.py", "", BackendPython},
}

// Platforms returns the platform names Triton accepts, sorted.
func Platforms() []string {
	out := make([]string, 0, len(platformBackend))
	for p := range platformBackend {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// BackendOf returns the backend that serves c: its backend field, or the
// backend implied by its platform ("" for ensembles and unknown platforms).
func BackendOf(c *configpb.ModelConfig) string {
	if c.GetBackend() != "" {
		return c.GetBackend()
	}
	return platformBackend[c.GetPlatform()]
}

// DefaultModelFilename returns the file Triton loads from a version directory
// of c: default_model_filename, else the platform's or backend's default
// ("" when there is none, as for ensembles and custom backends).
func DefaultModelFilename(c *configpb.ModelConfig) string {
	if f := c.GetDefaultModelFilename(); f != "" {
		return f
	}
	if f, ok := defaultFiles[c.GetPlatform()]; ok {
		return f
	}
	return defaultFiles[BackendOf(c)]
}

// isTensorRT reports whether c is served by the TensorRT backend.
func isTensorRT(c *configpb.ModelConfig) bool { return BackendOf(c) == BackendTensorRT }

// isEnsemble reports whether c is an ensemble.
func isEnsemble(c *configpb.ModelConfig) bool { return c.GetPlatform() == PlatformEnsemble }

// InferBackend fills platform and backend the way Triton's auto-complete
// does when a config names neither: from the model files present in a
// version directory, then from a model name of the form `model.<backend>`.
// It returns false when the backend cannot be determined.
func InferBackend(c *configpb.ModelConfig, modelName string, files []string) bool {
	if c.GetPlatform() != "" || c.GetBackend() != "" {
		return true
	}
	has := map[string]bool{}
	for _, f := range files {
		has[f] = true
	}
	if f := c.GetDefaultModelFilename(); f != "" && has[f] {
		for _, p := range platformOfFile {
			if strings.HasSuffix(f, strings.TrimPrefix(p.file, "model")) {
				c.Platform, c.Backend = p.platform, p.backend
				return true
			}
		}
	}
	for _, p := range platformOfFile {
		if has[p.file] {
			c.Platform, c.Backend = p.platform, p.backend
			return true
		}
	}
	if i := strings.LastIndexByte(modelName, '.'); i >= 0 && i < len(modelName)-1 {
		c.Backend = modelName[i+1:]
		return true
	}
	return false
}

// ParseVersion reads a version directory name the way Triton does
// (model_lifecycle.cc): a non-negative decimal integer without leading zeros.
// It returns false for names Triton ignores.
func ParseVersion(name string) (int64, bool) {
	if name == "" || name[0] < '0' || name[0] > '9' {
		return 0, false
	}
	if len(name) > 1 && name[0] == '0' {
		return 0, false
	}
	v, err := strconv.ParseInt(name, 10, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

// VersionsToLoad applies a version policy to the versions present on disk
// and returns the versions Triton would load, ascending. A nil policy is
// Triton's default, latest { num_versions: 1 }.
func VersionsToLoad(policy *configpb.ModelVersionPolicy, available []int64) []int64 {
	avail := append([]int64(nil), available...)
	sort.Slice(avail, func(i, j int) bool { return avail[i] < avail[j] })
	switch {
	case policy.GetAll() != nil:
		return avail
	case policy.GetSpecific() != nil:
		want := map[int64]bool{}
		for _, v := range policy.GetSpecific().GetVersions() {
			want[v] = true
		}
		var out []int64
		for _, v := range avail {
			if want[v] {
				out = append(out, v)
			}
		}
		return out
	}
	n := 1
	if l := policy.GetLatest(); l != nil {
		n = int(l.GetNumVersions())
	}
	if n > len(avail) {
		n = len(avail)
	}
	return avail[len(avail)-n:]
}
