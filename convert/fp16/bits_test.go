package fp16

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

// f32ToF16 agrees with the float16 library on every exponent, on rounding
// boundaries and on random bit patterns.
func TestF32ToF16MatchesLibrary(t *testing.T) {
	check := func(u uint32) {
		got := f32ToF16(u)
		want := float16.Fromfloat32(math.Float32frombits(u)).Bits()
		f := math.Float32frombits(u)
		if f != f { // NaN: only require a NaN with the same sign
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 || got&0x8000 != uint16(u>>16)&0x8000 {
				t.Fatalf("f32ToF16(%#08x NaN) = %#04x, not a NaN", u, got)
			}
			return
		}
		if got != want {
			t.Fatalf("f32ToF16(%#08x = %g) = %#04x, want %#04x", u, f, got, want)
		}
	}
	for exp := uint32(0); exp < 256; exp++ {
		for _, man := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fffff, 0x400000, 0x7fe000, 0x7ff000} {
			check(exp<<23 | man)
			check(1<<31 | exp<<23 | man)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1_000_000; i++ {
		check(rng.Uint32())
	}
}

// halfRaw's inlined loop gives the same bits and counts as half() value by value.
func TestHalfRawMatchesHalf(t *testing.T) {
	l := limits{minPos: 5.96e-08, maxFinite: 65504}
	rng := rand.New(rand.NewPCG(3, 4))
	vals := []float32{0, float32(math.Copysign(0, -1)), 1e-9, -1e-9, 7e4, -7e4, 65504, 65520, float32(math.Inf(1)), float32(math.NaN()), 1, -2.5, 6e-5, 3e-8}
	for i := 0; i < 100000; i++ {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
	}
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	dst, c, f, big := l.halfRaw(src)
	var wc, wf int
	var wbig float32
	for i, v := range vals {
		h, cl, fl := l.half(v)
		if cl {
			wc++
			wbig = max(wbig, float32(math.Abs(float64(v))))
		}
		if fl {
			wf++
		}
		got := binary.LittleEndian.Uint16(dst[2*i:])
		if v == v && got != h.Bits() || v != v && got&0x7c00 != 0x7c00 {
			t.Fatalf("halfRaw(%g) = %#04x, half = %#04x", v, got, h.Bits())
		}
	}
	if c != wc || f != wf || big != wbig {
		t.Errorf("halfRaw counts = %d clamped %d flushed (largest %g), want %d %d (%g)", c, f, big, wc, wf, wbig)
	}
}
