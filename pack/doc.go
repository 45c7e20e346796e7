// Package pack publishes a Triton model repository that kiln built: to a
// local directory (copied into a temporary directory and renamed), to an
// OCI image layout or a tarball of one (the OCI Image Layout Specification,
// read by skopeo, umoci, crane and docker load), and to an OCI registry as
// a serving image (a Triton base image plus one layer holding the
// repository under /models) or a model-only image (KServe modelcar). It
// reads an image or layout back into a directory, refusing entries that
// escape the target. Before anything is written it refuses models that
// would not load where they are going (guard.go): TensorRT plans built for
// another TensorRT release or GPU, and models without a passing check.
// Every destination is verified after it is written: files against
// kiln.json's digests, images by their manifest digest.
package pack
