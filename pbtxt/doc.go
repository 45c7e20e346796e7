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
// core server (model_config_utils.cc, ensemble_utils.cc, the sequence
// batcher's sequence_batch_scheduler.cc and sequence_state.cc), the checks
// the ONNX Runtime and TensorRT backends make when they load a model
// (onnxruntime_backend AutoCompleteConfig and ValidateInputs, tensorrt_backend
// auto-complete and input bindings against the engine's profiles) and the
// repository layout and version policy of model_lifecycle.cc.
// reference/formats.md §5 and §7.3 list the facts used here.
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
//     between signatures and what kiln.json records; PlanProfiles and
//     ProfilesFromCommand recover a TensorRT plan's optimization profiles
//     from the trtexec command kiln.json records (ParseShapeSpec reads its
//     --minShapes, --optShapes and --maxShapes), so that CheckSignature can
//     hold max_batch_size and dims to what the engine was built for.
package pbtxt
