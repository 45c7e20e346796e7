// Package convert builds the variants of a model: FP16 rewrites, INT8 Q/DQ
// models, TensorRT engines through trtexec, and caches them.
package convert
