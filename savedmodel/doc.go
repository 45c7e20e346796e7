// Package savedmodel reads TensorFlow SavedModels in pure Go: saved_model.pb
// (the SavedModel protobuf, with its MetaGraphDefs, graphs, functions,
// signatures and TF2 object graph), and the variables bundle beside it
// (variables/variables.index, a LevelDB-format table of BundleEntryProto
// records, and the variables.data-NNNNN-of-NNNNN shards they point into),
// following ../shared/reference/formats.md §6.
//
// Open finds the model under a path the way TensorFlow Serving does: a
// directory holding saved_model.pb is the model; otherwise its numeric
// subdirectories are versions and the highest one is used. Paths are local
// or gs://bucket/prefix, read through a dataset.FS, so the one GCS client of
// package dataset serves SavedModels too.
//
// A Bundle decodes checkpoint tensors into onnx.Tensor values with every
// stored checksum verified (the table's block checksums, each tensor's
// masked crc32c, and a string tensor's length checksum); TensorFromProto does
// the same for a graph's Const values. Bundle.TensorProto and
// InitializerFromProto give the ONNX initializers instead, keeping the
// stored little-endian bytes as raw_data rather than decoding and
// re-encoding them: Convert's model holds one copy of the weights. CheckpointKeys maps the nodes of a TF2
// object graph to the checkpoint keys holding their values.
//
// The message types are generated from kiln's own schema in package smpb.
package savedmodel
