package calibrate

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Expected strings are Python 3.11's str(float) and json.dumps.
func TestPyFloat(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want string
	}{
		{2, "2.0"}, {0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {-3.5, "-3.5"}, {100, "100.0"},
		{1e-05, "1e-05"}, {0.0001, "0.0001"}, {0.00012345, "0.00012345"}, {1.5e-7, "1.5e-07"},
		{1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1e22, "1e+22"}, {123456789012345678, "1.2345678901234568e+17"},
		{2.008338, "2.008338"}, {float64(float32(2.008338)), "2.00833797454834"}, {0.30000000000000004, "0.30000000000000004"},
		{1.0 / 127, "0.007874015748031496"}, {5e-324, "5e-324"}, {math.MaxFloat64, "1.7976931348623157e+308"},
		{12345.678, "12345.678"}, {math.NaN(), "nan"}, {math.Inf(1), "inf"}, {math.Inf(-1), "-inf"},
	} {
		if got := pyFloat(tt.in); got != tt.want {
			t.Errorf("pyFloat(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestPyJSONString(t *testing.T) {
	in := "a\"b\\c\n\r\t\b\f\x01\x7f é€𝄞 <>&"
	want := `"a\"b\\c\n\r\t\b\f\u0001\u007f \u00e9\u20ac\ud834\udd1e <>&"`
	if got := pyJSONString(in); got != want {
		t.Errorf("pyJSONString(%q) = %s, want %s", in, got, want)
	}
}

// One entry laid out by hand from the FlatBuffers rules.
func TestEncodeORTTableBytes(t *testing.T) {
	le := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		return b
	}
	var want []byte
	want = append(want, le(12)...)               // 0: root table at 12
	want = append(want, 6, 0, 8, 0, 4, 0, 0, 0)  // 4: TrtTable vtable + padding
	want = append(want, le(8, 4)...)             // 12: soffset 12-4, dict at 16+4
	want = append(want, le(1, 12)...)            // 20: 1 entry, table at 24+12
	want = append(want, 8, 0, 12, 0, 4, 0, 8, 0) // 28: KeyValue vtable
	want = append(want, le(8, 8, 12)...)         // 36: soffset 36-28, key at 40+8, value at 44+12
	want = append(want, le(1)...)                // 48: "a"
	want = append(want, 'a', 0, 0, 0)            //
	want = append(want, le(3)...)                // 56: "1.0"
	want = append(want, '1', '.', '0', 0)        //
	got := EncodeORTTable([]KeyValue{{"a", "1.0"}})
	if !slices.Equal(got, want) {
		t.Fatalf("EncodeORTTable(a=1.0) =\n% x\nwant\n% x", got, want)
	}
}

func TestORTTableRoundTrip(t *testing.T) {
	for _, kvs := range [][]KeyValue{
		nil,
		{{"images", "2.0"}},
		{{"input_1:0", "1e-05"}, {"(Unnamed Layer* 8) [Constant]_output", "12.5"}, {"", ""}, {"nul\x00inside", "x"}, {"éé", strings.Repeat("9", 1001)}},
	} {
		b := EncodeORTTable(kvs)
		if len(b)%4 != 0 {
			t.Errorf("EncodeORTTable: %d bytes, want a multiple of 4", len(b))
		}
		got, err := DecodeORTTable(b)
		if err != nil || !slices.Equal(got, kvs) && len(kvs) > 0 {
			t.Errorf("DecodeORTTable(EncodeORTTable(%q)) = %q, %v", kvs, got, err)
		}
	}
}

// A buffer laid out as Python's back-to-front flatbuffers.Builder does:
// strings and tables at the end, vtables after their tables (negative
// soffset is also allowed), vector in reverse order, shared vtable.
func TestDecodeORTTableOtherLayout(t *testing.T) {
	b := make([]byte, 0, 128)
	put32 := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	put16 := func(v uint16) { b = binary.LittleEndian.AppendUint16(b, v) }
	// 0: root offset; 4: root table whose vtable comes after it (soffset < 0).
	put32(4)
	put32(math.MaxUint32 - 7)   // 4: vtable at 12
	put32(12)                   // 8: dict at 20
	put16(6)                    // 12: vtable size
	put16(8)                    // 14: table size
	put16(4)                    // 16: dict at +4
	put16(0)                    // 18: padding
	put32(2)                    // 20: 2 entries
	put32(8 + 20)               // 24: entry 0 table at 52
	put32(4 + 36)               // 28: entry 1 table at 68 (reuses the vtable at 40 before its own table)
	put32(0)                    // 32: junk
	put32(0)                    // 36: junk
	put16(8)                    // 40: KeyValue vtable, size 8
	put16(12)                   // 42: table size 12
	put16(4)                    // 44: key at +4
	put16(8)                    // 46: value at +8
	put32(0)                    // 48: junk
	put32(52 - 40)              // 52: table 0
	put32(80 - 56)              // 56: key "b"
	put32(88 - 60)              // 60: value "2.0"
	put32(0)                    // 64: junk
	put32(68 - 40)              // 68: table 1 (shares vtable at 40)
	put32(96 - 72)              // 72: key "a"
	put32(104 - 76)             // 76: value "1.0"
	put32(1)                    // 80: "b"
	b = append(b, 'b', 0, 0, 0) //
	put32(3)                    // 88: "2.0"
	b = append(b, '2', '.', '0', 0)
	put32(1) // 96: "a"
	b = append(b, 'a', 0, 0, 0)
	put32(3) // 104: "1.0"
	b = append(b, '1', '.', '0', 0)
	got, err := DecodeORTTable(b)
	want := []KeyValue{{"b", "2.0"}, {"a", "1.0"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("DecodeORTTable = %q, %v, want %q", got, err, want)
	}
	m, err := ParseORTTable(b)
	if err != nil || m["a"] != 1 || m["b"] != 2 {
		t.Errorf("ParseORTTable = %v, %v, want a=1 b=2", m, err)
	}
}

func TestDecodeORTTableMalformed(t *testing.T) {
	good := EncodeORTTable([]KeyValue{{"a", "1.0"}, {"bb", "2.0"}})
	mutate := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	set32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	}
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "root"},
		{"root past end", set32(0, 1000)(slices.Clone(good)), "root"},
		{"vtable before start", set32(12, 100)(slices.Clone(good)), "vtable"},
		{"huge vector", set32(20, 1<<30)(slices.Clone(good)), "overruns"},
		{"entry offset past end", set32(24, 1<<31)(slices.Clone(good)), "dict[0]"},
		{"string length past end", set32(64, 1<<20)(slices.Clone(good)), "dict[0] key"}, // "a" is at 64
		{"missing NUL", mutate(func(b []byte) []byte { b[64+4+1] = 'x'; return b }), "NUL"},
		{"truncated", good[:len(good)-3], "dict[1] value"},
		{"bad vtable size", mutate(func(b []byte) []byte { b[32] = 3; return b }), "bad size"},
		{"field outside table", mutate(func(b []byte) []byte { b[32+6] = 40; return b }), "outside the 12-byte table"},
		{"missing key", mutate(func(b []byte) []byte { b[32+4] = 0; return b }), "dict[0] key: missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeORTTable(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "malformed flatbuffers") {
				t.Errorf("DecodeORTTable(% x) error = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
	// No dict field: an empty table.
	if kvs, err := DecodeORTTable([]byte{8, 0, 0, 0, 4, 0, 4, 0, 4, 0, 0, 0}); err != nil || len(kvs) != 0 {
		t.Errorf("DecodeORTTable(no dict) = %v, %v, want an empty table", kvs, err)
	}
}

func TestWriteORTTable(t *testing.T) {
	dir := t.TempDir()
	amax := map[string]float64{"input_1:0": 2, "conv/out": 1e-05, "relu": 6.125, "é": 0.30000000000000004}
	if err := WriteORTTable(dir, amax); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		ORTTableText: "conv/out 1e-05\ninput_1:0 2.0\nrelu 6.125\né 0.30000000000000004\n",
		ORTTableJSON: `{"conv/out": [-1e-05, 1e-05], "input_1:0": [-2.0, 2.0], "relu": [-6.125, 6.125], "\u00e9": [-0.30000000000000004, 0.30000000000000004]}`,
	}
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != w {
			t.Errorf("%s = %q, %v, want %q", name, got, err, w)
		}
	}
	fb, _ := os.ReadFile(filepath.Join(dir, ORTTableName))
	kvs, err := DecodeORTTable(fb)
	if err != nil || len(kvs) != 4 || kvs[0] != (KeyValue{"conv/out", "1e-05"}) || kvs[1] != (KeyValue{"input_1:0", "2.0"}) {
		t.Errorf("DecodeORTTable(%s) = %q, %v, want sorted keys with Python floats", ORTTableName, kvs, err)
	}
	back, err := ReadORTTable(dir)
	if err != nil || !mapsEqual(back, amax) {
		t.Errorf("ReadORTTable = %v, %v, want %v", back, err, amax)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Errorf("WriteORTTable left %d files, want exactly 3 (no temporaries)", len(entries))
	}
	for _, bad := range []map[string]float64{{"": 1}, {"a\nb": 1}, {"a": math.NaN()}, {"a": math.Inf(1)}} {
		if err := WriteORTTable(t.TempDir(), bad); err == nil {
			t.Errorf("WriteORTTable(%v) = nil error, want one", bad)
		}
	}
}

// FuzzFlatbufferTable: the decoder never panics, and what it accepts
// re-encodes and decodes to the same entries.
func FuzzFlatbufferTable(f *testing.F) {
	f.Add(EncodeORTTable(nil))
	f.Add(EncodeORTTable([]KeyValue{{"a", "1.0"}}))
	f.Add(EncodeORTTable([]KeyValue{{"input_1:0", "1e-05"}, {"(Unnamed Layer* 8) [Constant]_output", "12.5"}}))
	f.Add([]byte{8, 0, 0, 0, 4, 0, 4, 0, 4, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		kvs, err := DecodeORTTable(data)
		if err != nil {
			return
		}
		again, err := DecodeORTTable(EncodeORTTable(kvs))
		if err != nil || len(again) != len(kvs) || (len(kvs) > 0 && !slices.Equal(again, kvs)) {
			t.Fatalf("DecodeORTTable(EncodeORTTable(%q)) = %q, %v", kvs, again, err)
		}
		_, _ = ParseORTTable(data)
	})
}
