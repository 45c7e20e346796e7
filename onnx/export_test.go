package onnx

// SetBigRaw lowers the fast-path threshold so tests exercise it with small models.
func SetBigRaw(n int) (restore func()) {
	old := bigRaw
	bigRaw = n
	return func() { bigRaw = old }
}
