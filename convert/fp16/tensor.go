package fp16

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
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
//
// It works on the bit patterns: for non-negative IEEE floats the order of
// the magnitudes is the order of the bits, so the tests are integer
// compares, which keeps the rewrite of a large model close to memory speed.
func (l limits) half(v float32) (h float16.Float16, clamped, flushed bool) {
	u := math.Float32bits(v)
	sign, a := u&0x80000000, u&0x7fffffff
	switch {
	case a == 0 || a >= 0x7f800000: // zero, infinity, NaN: kept
	case a < math.Float32bits(l.minPos):
		u, flushed = sign|math.Float32bits(l.minPos), true
	case a > math.Float32bits(l.maxFinite):
		u, clamped = sign|math.Float32bits(l.maxFinite), true
	}
	return float16.Frombits(f32ToF16(u)), clamped, flushed
}

// f32ToF16 rounds float32 bits to float16 bits, to nearest with ties to
// even, like float16.Fromfloat32 (whose tests cover the same cases), but
// inlinable in the conversion loop.
func f32ToF16(u uint32) uint16 {
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN (keep a quiet NaN payload bit)
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	case exp > 142: // >= 2^16: overflows float16
		return sign | 0x7c00
	case exp < 102: // below 2^-25, half the smallest subnormal: rounds to zero
		return sign
	case exp < 113: // float16 subnormal
		man |= 0x800000
		shift := uint32(126 - exp)
		half := uint32(1) << (shift - 1)
		rest := man & (1<<shift - 1)
		r := man >> shift
		if rest > half || (rest == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp-112)<<10 | man>>13
	rest := man & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to infinity: correct rounding
	}
	return sign | uint16(r)
}

// parallelMin is the element count above which a tensor is converted by
// several goroutines.
const parallelMin = 1 << 20

// halfRaw converts little-endian float32 bytes to little-endian float16
// bytes, returning how many values were clamped and flushed, and the
// largest magnitude clamped.
func (l limits) halfRaw(src []byte) (dst []byte, clamped, flushed int, largest float32) {
	n := len(src) / 4
	dst = make([]byte, 2*n)
	minB, maxB := math.Float32bits(l.minPos), math.Float32bits(l.maxFinite)
	// The loop is half() and f32ToF16 by hand, with the common case (a
	// normal float16 result) inline: this is the whole cost of the rewrite.
	work := func(lo, hi int) (c, f int, big uint32) {
		le := binary.LittleEndian
		for i := lo; i < hi; i++ {
			u := le.Uint32(src[4*i:])
			a := u & 0x7fffffff
			switch {
			case a-1 < minB-1: // 0 < a < minPos
				u, f = u&0x80000000|minB, f+1
			case a > maxB && a < 0x7f800000:
				u, c, big = u&0x80000000|maxB, c+1, max(big, a)
			}
			var h uint16
			if exp := u >> 23 & 0xff; exp-113 < 30 { // normal float16 result
				r := (exp-112)<<10 | (u&0x7fffff)>>13
				if rest := u & 0x1fff; rest > 0x1000 || (rest == 0x1000 && r&1 == 1) {
					r++
				}
				h = uint16(u>>16)&0x8000 | uint16(r)
			} else {
				h = f32ToF16(u)
			}
			le.PutUint16(dst[2*i:], h)
		}
		return c, f, big
	}
	workers := runtime.GOMAXPROCS(0)
	if n < parallelMin || workers == 1 {
		c, f, big := work(0, n)
		return dst, c, f, math.Float32frombits(big)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bigAll uint32
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, f, big := work(lo, hi)
			mu.Lock()
			clamped += c
			flushed += f
			bigAll = max(bigAll, big)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return dst, clamped, flushed, math.Float32frombits(bigAll)
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
		raw, info.Clamped, info.Flushed, info.Largest = l.halfRaw(t.RawData)
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
				info.Largest = max(info.Largest, float32(math.Abs(float64(v))))
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
