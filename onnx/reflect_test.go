package onnx_test

import "google.golang.org/protobuf/reflect/protoreflect"

type (
	protoreflectFieldDescriptor = protoreflect.FieldDescriptor
	protoreflectValue           = protoreflect.Value
)
