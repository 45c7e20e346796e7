// Package pbtxt reads, writes and checks NVIDIA Triton model configurations
// (config.pbtxt, protobuf text format of inference.ModelConfig) and the model
// repositories that hold them.
//
// It is a building block, not a stage: convert writes configs with it,
// serve and pack read repositories with it, and `kiln pbtxt` exposes it. It
// uses only the other building blocks (onnx for model signatures, manifest
// for the signatures kiln.json records for TensorRT plans).
//
// It follows Triton's own rules: the schema of model_config.proto
// (configpb, package inference), the text format as Triton's C++ parser
// accepts it (both `input [ {...} ]` and repeated `input {...}`, `#` comments,
// an optional `:` before messages), the validation and normalisation of the
// core server (model_config_utils.cc, ensemble_utils.cc), ONNX Runtime's
// auto-complete (onnxruntime_backend AutoCompleteConfig) and the repository
// layout and version policy of model_lifecycle.cc. reference/formats.md §5
// lists the facts used here.
//
// The pieces:
//   - Parse reads a config and reports syntax errors with line and column.
//   - Print writes a config deterministically in Triton's documentation style.
//   - Validate checks a config on its own; CheckSignature checks it against
//     the model's inputs and outputs; ReadRepository and LintRepository check
//     a whole repository, model files and ensembles included.
//   - Generate builds a config from a model signature, the way Triton's
//     auto-complete would, plus kiln's deployment options.
//   - WriteModel lays a model out in a repository atomically.
//   - SignatureFromManifest, ManifestTensors and PlanSignatures convert
//     between signatures and what kiln.json records.
package pbtxt
