package manifest

import "testing"

// FuzzParseTRTSpec: the one TensorRT version parser never panics, and what
// it accepts is written back (String, Number) and read again unchanged.
func FuzzParseTRTSpec(f *testing.F) {
	for _, s := range []string{"10.3", "10.3.0", "v10.16.1", "100300", "8601", "7000", "10000", "10", "6.0.1", "10.03", "99.99.99", "9999999", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseTRTSpec(s)
		if err != nil {
			return
		}
		back, err := ParseTRTSpec(spec.String())
		if err != nil || back != spec {
			t.Fatalf("ParseTRTSpec(%q) = %+v, but its String %q reads back as %+v, %v", s, spec, spec.String(), back, err)
		}
		if v, err := ParseTRTSpec(itoa(spec.Number())); err != nil || v.TRTVersion != spec.TRTVersion {
			t.Fatalf("ParseTRTSpec(%q) = %v, whose number %d reads back as %v, %v", s, spec.TRTVersion, spec.Number(), v, err)
		}
	})
}

// FuzzParseVariant: variant IDs never panic the parser, and an accepted ID
// is written back by ID and read again to the same variant.
func FuzzParseVariant(f *testing.F) {
	for _, s := range []string{"trt-int8-b16-x4", "onnx_fp16_b4_x1", "trt-fp16-sm86", "tensorrt-fp32-sm120", "onnx-fp32-b", "trt-fp16-smx6", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVariant(s)
		if err != nil {
			return
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("ParseVariant(%q) = %+v, which does not validate: %v", s, v, err)
		}
		back, err := ParseVariant(v.ID())
		if err != nil || back != v {
			t.Fatalf("ParseVariant(%q) = %+v, but its ID %q reads back as %+v, %v", s, v, v.ID(), back, err)
		}
		if cc := v.Target; cc != "" {
			if again, err := ParseComputeCapability(cc); err != nil || again != cc {
				t.Fatalf("compute capability %q reads back as %q, %v", cc, again, err)
			}
		}
	})
}

func itoa(n int) string { // strconv.Itoa for the non-negative numbers here
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
