package onnx

// SetBigRaw lowers the fast-path threshold so tests exercise it with small models.
func SetBigRaw(n int) (restore func()) {
	old := bigRaw
	bigRaw = n
	return func() { bigRaw = old }
}

// SetMaxProto lowers the 2 GiB limit so tests can hit it with small models.
func SetMaxProto(n int64) (restore func()) {
	old := maxProto
	maxProto = n
	return func() { maxProto = old }
}
