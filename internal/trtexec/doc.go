// Package trtexec drives NVIDIA's trtexec, the TensorRT command-line tool
// that builds kiln's engines: it spells a build's flags for each TensorRT
// release (Args), runs the build (Tool.Build), runs built engines on given
// inputs for their outputs and timing (Tool.Infer), reads trtexec's banner,
// console log and exported outputs (ParseBanner, ParseLog,
// ParseExportOutput), asks nvidia-smi about the GPU (QueryGPUs), refuses
// builds for another target (Target) and records how an engine was made
// (Provenance).
//
// It follows trtexec's documented flags and outputs: trtexec --help, the
// trtexec sources (NVIDIA/TensorRT samples/common/sampleOptions.cpp,
// logging.h and sampleReporting.cpp) and reference/formats.md §7, checked
// against the real logs of the shared corpus; and nvidia-smi's documented
// --query-gpu CSV format (nvidia-smi --help-query-gpu).
package trtexec
