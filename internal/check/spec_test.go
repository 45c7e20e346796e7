package check

import (
	"slices"
	"testing"
)

func TestParseDims(t *testing.T) {
	cases := []struct {
		in   string
		want []int64
		bad  bool
	}{
		{"1x3x640x640", []int64{1, 3, 640, 640}, false},
		{"1,512", []int64{1, 512}, false},
		{"scalar", []int64{}, false},
		{"", []int64{}, false},
		{"1x-3", nil, true},
		{"-1x3", []int64{-1, 3}, false}, // dynamic
		{"1x-2", nil, true},
		{"1xx3", nil, true},
		{"axb", nil, true},
		{"99999999999", nil, true},
	}
	for _, c := range cases {
		got, err := ParseDims(c.in)
		if (err != nil) != c.bad {
			t.Errorf("ParseDims(%q) error = %v, want error %v", c.in, err, c.bad)
			continue
		}
		if !c.bad && !slices.Equal(got, c.want) {
			t.Errorf("ParseDims(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestParseBindings(t *testing.T) {
	in, err := ParseInputs([]string{"sr=16000", "input_1:0=a=b.npy"})
	if err != nil {
		t.Fatal(err)
	}
	if in["sr"] != "16000" || in["input_1:0=a"] != "b.npy" {
		t.Errorf("ParseInputs = %v, want sr=16000 and the name up to the last '='", in)
	}
	if _, err := ParseInputs([]string{"sr=1", "sr=2"}); err == nil {
		t.Error("ParseInputs accepted an input given twice")
	}
	for _, bad := range []string{"=1", "sr=", "sr"} {
		if _, err := ParseInputs([]string{bad}); err == nil {
			t.Errorf("ParseInputs(%q) accepted it", bad)
		}
	}
	sh, err := ParseShapes([]string{"x=1x3x640x640", "state=2x1x128"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sh["x"], []int64{1, 3, 640, 640}) || !slices.Equal(sh["state"], []int64{2, 1, 128}) {
		t.Errorf("ParseShapes = %v", sh)
	}
}

func FuzzParseDims(f *testing.F) {
	for _, s := range []string{"1x3x224x224", "1,2", "scalar", "", "0", "1x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDims(s)
		if err != nil {
			return
		}
		again, err := ParseDims(FormatDims(d))
		if err != nil || !slices.Equal(again, d) {
			t.Fatalf("ParseDims(FormatDims(%v)) = %v, %v", d, again, err)
		}
	})
}
