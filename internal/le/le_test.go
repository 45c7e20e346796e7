package le

import (
	"encoding/binary"
	"math"
	"reflect"
	"testing"

	"github.com/x448/float16"
)

// pattern is 16 bytes whose every group reads differently in each order.
var pattern = []byte{0x01, 0x82, 0x03, 0x84, 0x05, 0x86, 0x07, 0x88, 0x09, 0x8a, 0x0b, 0x8c, 0x0d, 0x8e, 0x0f, 0x90}

// TestDecode checks every kind of Number against encoding/binary's reading
// of the same bytes, in both byte orders.
func TestDecode(t *testing.T) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		little := order == binary.LittleEndian
		// Reading in the host's order with little set to false is reading
		// the other order: the big-endian host's path, on this machine.
		host := little == littleHost
		u16, u32, u64 := order.Uint16, order.Uint32, order.Uint64
		cases := []struct {
			got, want any
		}{
			{decode[int8](pattern, host), []int8{1, -126, 3, -124, 5, -122, 7, -120, 9, -118, 11, -116, 13, -114, 15, -112}},
			{decode[uint8](pattern, host), pattern},
			{decode[int16](pattern, host), []int16{int16(u16(pattern[0:])), int16(u16(pattern[2:])), int16(u16(pattern[4:])), int16(u16(pattern[6:])),
				int16(u16(pattern[8:])), int16(u16(pattern[10:])), int16(u16(pattern[12:])), int16(u16(pattern[14:]))}},
			{decode[float16.Float16](pattern[:4], host), []float16.Float16{float16.Frombits(u16(pattern)), float16.Frombits(u16(pattern[2:]))}},
			{decode[uint32](pattern, host), []uint32{u32(pattern), u32(pattern[4:]), u32(pattern[8:]), u32(pattern[12:])}},
			{decode[float32](pattern[:8], host), []float32{math.Float32frombits(u32(pattern)), math.Float32frombits(u32(pattern[4:]))}},
			{decode[int64](pattern, host), []int64{int64(u64(pattern)), int64(u64(pattern[8:]))}},
			{decode[float64](pattern, host), []float64{math.Float64frombits(u64(pattern)), math.Float64frombits(u64(pattern[8:]))}},
			{decode[complex64](pattern, host), []complex64{
				complex(math.Float32frombits(u32(pattern)), math.Float32frombits(u32(pattern[4:]))),
				complex(math.Float32frombits(u32(pattern[8:])), math.Float32frombits(u32(pattern[12:]))),
			}},
			{decode[complex128](pattern, host), []complex128{complex(math.Float64frombits(u64(pattern)), math.Float64frombits(u64(pattern[8:])))}},
		}
		for _, c := range cases {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("%v decode to %T = %v, want %v", order, c.want, c.got, c.want)
			}
		}
	}
}

// TestEncode checks that Encode inverts Decode in both byte orders.
func TestEncode(t *testing.T) {
	for _, little := range []bool{true, false} {
		check := func(name string, got []byte) {
			t.Helper()
			if !reflect.DeepEqual(got, pattern[:len(got)]) || len(got) == 0 {
				t.Errorf("encode(decode[%s](pattern), little=%v) = %x, want %x", name, little, got, pattern)
			}
		}
		check("int8", encode(decode[int8](pattern, little), little))
		check("uint16", encode(decode[uint16](pattern, little), little))
		check("float16", encode(decode[float16.Float16](pattern, little), little))
		check("int32", encode(decode[int32](pattern, little), little))
		check("float32", encode(decode[float32](pattern, little), little))
		check("uint64", encode(decode[uint64](pattern, little), little))
		check("float64", encode(decode[float64](pattern, little), little))
		check("complex64", encode(decode[complex64](pattern, little), little))
		check("complex128", encode(decode[complex128](pattern, little), little))
	}
}

func TestEdges(t *testing.T) {
	if got := Decode[float32](nil); got == nil || len(got) != 0 {
		t.Errorf("Decode(nil) = %#v, want an empty non-nil slice", got)
	}
	if got := Encode([]float32{}); got == nil || len(got) != 0 {
		t.Errorf("Encode(empty) = %#v, want an empty non-nil slice", got)
	}
	if got := Encode[float32](nil); got == nil {
		t.Error("Encode(nil) = nil, want an empty non-nil slice")
	}
	if got := Decode[uint32](pattern[:7]); len(got) != 1 {
		t.Errorf("Decode of 7 bytes = %d uint32s, want 1 (the partial value ignored)", len(got))
	}
	src := append([]byte(nil), pattern...)
	d := Decode[uint16](src)
	src[0] = 0xff
	if d[0] != 0x8201 {
		t.Errorf("Decode shares memory with its input: d[0] = %#x after changing the input", d[0])
	}
	s := []uint16{1, 2}
	b := Encode(s)
	s[0] = 7
	if b[0] != 1 {
		t.Error("Encode shares memory with its input")
	}
	if Size[complex128]() != 16 || Size[float16.Float16]() != 2 || Size[int8]() != 1 {
		t.Errorf("Size = %d, %d, %d, want 16, 2, 1", Size[complex128](), Size[float16.Float16](), Size[int8]())
	}
}
