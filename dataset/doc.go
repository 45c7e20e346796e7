// Package dataset reads the samples kiln calibrates and checks models with.
//
// A dataset is opened from a local path or a gs:// prefix (through an FS) and
// is streamed: Open builds only an index (a file list, record offsets, row
// counts) and every Sample is read when it is asked for. The formats follow
// their specifications:
//
//   - NumPy .npy files as specified by NEP 1 ("A simple file format for NumPy
//     arrays", header versions 1.0, 2.0 and 3.0) and .npz files, ZIP archives
//     of .npy members keyed by tensor name (stored or deflated);
//   - ONNX TensorProto .pb files, alone or in the onnx backend-test layout
//     test_data_set_N/input_M.pb, where input M binds to the M-th model input;
//   - TFRecord files (TensorFlow's record framing: length, masked CRC-32C of
//     the length, data, masked CRC-32C of the data) holding tf.Example protos
//     with an encoded image feature, as in the TF-TRT calibration tutorial;
//   - KServe v2 (Open Inference Protocol) JSON inference request bodies and
//     Triton perf_analyzer --input-data JSON;
//   - directories of JPEG and PNG images, turned into tensors by a
//     Preprocess spec (resize, center crop, scale, mean/std, channel order,
//     layout, element type).
//
// # Samples and the batch dimension
//
// A Sample holds one example. When the model is batched (see Batched: every
// input has dimension 0 as its batch dimension) a Sample's tensors have no
// batch dimension: an image is [3,224,224], not [1,3,224,224]. Files that
// store one sample with a leading batch dimension of 1 are accepted and the
// dimension is dropped by Conform. Files given alone that hold many rows (one
// stacked .npy or .npz, a KServe request with shape [8,...]) are split along
// dimension 0. For an unbatched model a Sample holds whole model inputs and
// batches have size 1. Batches stacks samples back along a new dimension 0.
package dataset
