// Package configpb holds the Go types generated from kiln's own schema of
// Triton's model configuration, model_config.proto in this directory
// (protobuf package `inference`, as upstream). Regenerate with `make generate`.
package configpb

//go:generate protoc --plugin=protoc-gen-go=../../.bin/protoc-gen-go --go_out=. --go_opt=paths=source_relative model_config.proto
