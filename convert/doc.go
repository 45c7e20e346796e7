// Package convert builds the variants of a model into a Triton model
// repository: ONNX fp32, the fp16 rewrite (convert/fp16) and the int8 Q/DQ
// model from calibration, and TensorRT engines through trtexec
// (internal/trtexec). It checks the variants asked for against the model,
// writes each as a Triton model with its config.pbtxt (pbtxt), records how
// each was made in kiln.json (manifest) and reuses what an earlier run
// built when nothing it depends on changed. Names and layout follow
// DESIGN.md "Variants and names"; Triton's model repository layout is
// reference/formats.md §5.
package convert
