// Package fp16 rewrites ONNX graphs to float16 (reference/formats.md §4),
// following onnxruntime's improved copy of onnxconverter-common's
// float16.py (§4.2):
//
//   - Every float32 tensor becomes float16 except where a node must stay
//     float32: nodes whose op type is in OpBlockList (by default
//     float16.py's list plus ONNX Runtime CPU gaps, and ScatterND /
//     ScatterElements with a reduction), nodes named in NodeBlockList or
//     kept by an Analysis, Casts from float32 to anything but float, and
//     nodes whose ONNX type constraints exclude float16 at the model's
//     opset or that float16 would change or ONNX Runtime fails to load
//     (fp32Only: QuantizeLinear/DequantizeLinear below opset 19,
//     DynamicQuantizeLinear, NonMaxSuppression, Range, Celu, CumSum below
//     14, IsInf, Pow below 12). Blocked nodes read float32 through
//     Cast(to=FLOAT) and their float outputs are cast back with
//     Cast(to=FLOAT16); one Cast per value and direction is shared by all
//     consumers. Q/DQ below opset 19 are
//     treated as blocked, so their scales stay float32 and the activations
//     are cast around them.
//   - Resize's scales (input 2), Upsample's scales and Pow's exponent
//     (from opset 12) stay float32 even in kept nodes (ALWAYS_FLOAT_INPUTS).
//   - Initializers and Constant/ConstantOfShape values are converted only
//     when a float16 consumer uses them; one used by both kinds is converted
//     and cast back for the float32 consumers (with a warning).
//   - Values are clamped to [MinPositive, MaxFinite] in magnitude before
//     rounding (zero, infinities and NaN kept); the counts and the largest
//     value clamped are reported per tensor, each with a warning.
//   - Kept Cast(to=FLOAT) become Cast(to=FLOAT16); dtype-like attributes of
//     RandomNormal, EyeLike, the window functions... are set to FLOAT16.
//   - If/Loop/Scan bodies are converted recursively with the same rules; a
//     blocked control-flow node keeps its whole body float32.
//   - value_info entries are retyped (and added for the new values), the
//     nodes are sorted topologically, and Cast pairs that cancel out
//     (float16→float32→float16, float32→float16→float32) or casts to the type
//     a value already has are removed.
//
// Analyze is the data-aware pass of NVIDIA ModelOpt's AutoCast (§4.3): it
// runs the float32 model on samples, measures every float tensor of the
// main graph, and lists the nodes whose activations or weights float16
// cannot hold, with the reason; Options.Analysis hands them to Convert.
//
// Convert refuses what it cannot rewrite with an *UnsupportedError (or
// ErrAlreadyFloat16) before anything is written.
//
// Element types are inferred by kiln's own rules (types.go) because
// ONNX shape inference is not available in Go; nodes from domains other than
// the default one are refused unless they are blocked.
package fp16
