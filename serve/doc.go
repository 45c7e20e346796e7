// Package serve is kiln's last stage: it loads every artifact of a model
// repository (or one model file), runs it on real or recorded data,
// compares it with the fp32 ONNX Runtime reference (internal/check), times
// it over a concurrency sweep the way Triton's perf_analyzer does, and says
// plainly whether each artifact may ship (serve/report). It also serves a
// repository over the KServe v2 protocol (serve/kserve).
//
// Runtimes: ONNX Runtime for onnxruntime_onnx models (CPU, or its CUDA and
// TensorRT execution providers), trtexec for tensorrt_plan models, and a
// KServe v2 client for a running Triton. An artifact whose runtime is
// missing here is "not checked", never passed. DESIGN.md "Checks (serve)"
// and "Runtimes and the GPU" give the contract.
package serve
