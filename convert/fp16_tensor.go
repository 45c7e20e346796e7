package convert

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// limits are the clamping bounds of onnxruntime float16.py
// convert_np_to_float16: a finite non-zero value whose magnitude is below
// minPos becomes ±minPos, one above maxFinite becomes ±maxFinite; zero,
// infinities and NaN are kept. The result is then rounded to the nearest
// float16 (ties to even).
type limits struct {
	minPos, maxFinite float32
}

// half converts one value, reporting whether it was clamped to ±maxFinite
// or flushed up to ±minPos.
func (l limits) half(v float32) (h float16.Float16, clamped, flushed bool) {
	a := float32(math.Abs(float64(v)))
	switch {
	case a == 0 || a != a || math.IsInf(float64(a), 0):
	case a < l.minPos:
		v, flushed = float32(math.Copysign(float64(l.minPos), float64(v))), true
	case a > l.maxFinite:
		v, clamped = float32(math.Copysign(float64(l.maxFinite), float64(v))), true
	}
	return float16.Fromfloat32(v), clamped, flushed
}

// parallelMin is the element count above which a tensor is converted by
// several goroutines.
const parallelMin = 1 << 20

// halfRaw converts little-endian float32 bytes to little-endian float16
// bytes, returning how many values were clamped and flushed.
func (l limits) halfRaw(src []byte) (dst []byte, clamped, flushed int) {
	n := len(src) / 4
	dst = make([]byte, 2*n)
	work := func(lo, hi int) (c, f int) {
		le := binary.LittleEndian
		for i := lo; i < hi; i++ {
			h, cl, fl := l.half(math.Float32frombits(le.Uint32(src[4*i:])))
			le.PutUint16(dst[2*i:], h.Bits())
			if cl {
				c++
			}
			if fl {
				f++
			}
		}
		return c, f
	}
	workers := runtime.GOMAXPROCS(0)
	if n < parallelMin || workers == 1 {
		c, f := work(0, n)
		return dst, c, f
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, f := work(lo, hi)
			mu.Lock()
			clamped += c
			flushed += f
			mu.Unlock()
		}()
	}
	wg.Wait()
	return dst, clamped, flushed
}

// halfTensor returns a float16 copy of a float32 TensorProto, stored as
// raw_data, and the clamping counts.
func (l limits) halfTensor(t *onnxpb.TensorProto) (*onnxpb.TensorProto, ClampInfo, error) {
	info := ClampInfo{Tensor: t.GetName()}
	if onnx.DataType(t.GetDataType()) != onnx.Float {
		return nil, info, fmt.Errorf("tensor %q is %s, not float32", t.GetName(), onnx.DataType(t.GetDataType()))
	}
	if t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL && t.RawData == nil {
		return nil, info, fmt.Errorf("tensor %q: %w", t.GetName(), onnx.ErrExternalData)
	}
	n, err := onnx.NumElements(t.GetDims())
	if err != nil {
		return nil, info, fmt.Errorf("tensor %q: %w", t.GetName(), err)
	}
	var raw []byte
	switch {
	case t.RawData != nil:
		if len(t.RawData) != 4*n {
			return nil, info, fmt.Errorf("tensor %q: raw_data has %d bytes, shape %v needs %d", t.GetName(), len(t.RawData), t.GetDims(), 4*n)
		}
		raw, info.Clamped, info.Flushed = l.halfRaw(t.RawData)
	default:
		if len(t.FloatData) != n {
			return nil, info, fmt.Errorf("tensor %q: float_data has %d values, shape %v needs %d", t.GetName(), len(t.FloatData), t.GetDims(), n)
		}
		raw = make([]byte, 2*n)
		for i, v := range t.FloatData {
			h, c, f := l.half(v)
			binary.LittleEndian.PutUint16(raw[2*i:], h.Bits())
			if c {
				info.Clamped++
			}
			if f {
				info.Flushed++
			}
		}
	}
	out := cloneExcept(t, "raw_data", "float_data").(*onnxpb.TensorProto)
	out.DataType = proto.Int32(int32(onnx.Float16))
	out.RawData = raw
	out.DataLocation = nil
	out.ExternalData = nil
	return out, info, nil
}
