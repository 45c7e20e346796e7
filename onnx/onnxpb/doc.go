// Package onnxpb holds the Go types generated from kiln's own ONNX schema,
// onnx.proto in this directory. Regenerate with `make generate`.
package onnxpb

//go:generate protoc --plugin=protoc-gen-go=../../.bin/protoc-gen-go --go_out=. --go_opt=paths=source_relative onnx.proto
