// Package calibrate computes INT8 quantization ranges for the activations of
// an ONNX model and writes them in the files that TensorRT and ONNX Runtime
// read.
//
// The numeric core follows TensorRT's EntropyCalibrator2 as re-implemented by
// NVIDIA's pytorch-quantization (tools/pytorch-quantization/pytorch_quantization/
// calib/histogram.py): activations are summarised per tensor in a Histogram of
// |x| with 2048 bins that grows by appending bins of the same width, and a
// range Method turns the histogram into an amax and a symmetric scale
// amax/127:
//
//   - minmax: amax = max|x| (TensorRT's MinMaxCalibrator);
//   - percentile: the bin edge where the cdf of |x| reaches p (default 99.999);
//   - entropy: the cut that minimises the KL divergence between the clipped
//     distribution and its 128-level quantization (EntropyCalibrator2);
//   - mse: the bin centre that minimises the squared fake-quantization error.
//
// Unlike ONNX Runtime's default entropy calibrator (128 bins, which leaves a
// single candidate and so degenerates to min/max) the entropy method always
// searches a histogram of at least 2048 bins.
//
// The results are written as a kiln ranges file (JSON, see Ranges), as a
// TensorRT calibration cache ("TRT-<version>-EntropyCalibration2" followed by
// "<tensor>: <hex float32 scale>" lines, see Cache) and as ONNX Runtime's
// TensorRT execution provider calibration table (calibration.cache,
// calibration.json and calibration.flatbuffers, see WriteORTTable). Byte-level
// facts for every format are in the project's reference/formats.md §1–§2.
//
// Collecting activations with ONNX Runtime, writing the Q/DQ model and
// measuring the accuracy of the quantized model belong in other files of this
// package; they need only NewHistogram, (*Histogram).Add (and Merge for
// parallel collection), ParseMethod, Compute and the writers above.
//
// Run writes all of these into one output directory, which ReadOutput reads
// back as the manifest.CalibrationOutput that convert builds int8 variants
// from; RunCached keeps such directories in a cache, named for what decides
// their content.
package calibrate
