// Package smpb holds the Go types generated from kiln's own schema for
// TensorFlow's SavedModel, graph, checkpoint-object and tensor-bundle
// messages, savedmodel.proto in this directory. Regenerate with `make generate`.
package smpb

//go:generate protoc --plugin=protoc-gen-go=../../.bin/protoc-gen-go --go_out=. --go_opt=paths=source_relative savedmodel.proto
