package check

import (
	"strings"
	"testing"
)

func TestParseOverride(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Override
		str  string // String() when not in
	}{
		{"cosine=0.995", Override{Metric: "cosine", Value: 0.995}, ""},
		{"det_onnx_fp16:cosine=0.99", Override{Model: "det_onnx_fp16", Metric: "cosine", Value: 0.99}, ""},
		{"det_onnx_fp16/sigmoid_0.tmp_0:rtol=0.05", Override{Model: "det_onnx_fp16", Output: "sigmoid_0.tmp_0", Metric: "rtol", Value: 0.05}, ""},
		{"*/logits:top1=0.97", Override{Output: "logits", Metric: "top1", Value: 0.97}, ""},
		{"*:top5=0.9", Override{Metric: "top5", Value: 0.9}, "top5=0.9"},
		{"m/*:agreement=0.9", Override{Model: "m", Metric: "agreement", Value: 0.9}, "m:agreement=0.9"},
		{"*/*:worst_cosine=0.9", Override{Metric: "worst_cosine", Value: 0.9}, "worst_cosine=0.9"},
		{"m/Identity:0:atol=1e-3", Override{Model: "m", Output: "Identity:0", Metric: "atol", Value: 1e-3}, "m/Identity:0:atol=0.001"},
		{"m/dense/BiasAdd:0:atol=1", Override{Model: "m", Output: "dense/BiasAdd:0", Metric: "atol", Value: 1}, ""},
		{"allow_non_finite=1", Override{Metric: "allow_non_finite", Value: 1}, "allow_non_finite=true"},
		{"m:allow_non_finite=false", Override{Model: "m", Metric: "allow_non_finite", Value: 0}, ""},
		{"top1=0", Override{Metric: "top1", Value: 0}, ""},
		{"rtol=5", Override{Metric: "rtol", Value: 5}, ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseOverride(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseOverride(%q) = %+v, %v, want %+v", tc.in, got, err, tc.want)
			}
			want := tc.str
			if want == "" {
				want = tc.in
			}
			if s := got.String(); s != want {
				t.Errorf("ParseOverride(%q).String() = %q, want %q", tc.in, s, want)
			}
		})
	}
}

func TestParseOverrideErrors(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"", "METRIC=VALUE"},
		{"cosine", `"cosine" is not METRIC=VALUE`},
		{"cosin=0.9", `unknown metric "cosin"`},
		{"m:=0.9", `unknown metric ""`},
		{"cosine=", `cosine value "" is not a finite number`},
		{"cosine=high", `"high"`},
		{"cosine=NaN", `"NaN"`},
		{"atol=inf", `"inf"`},
		{"atol=1e999", `"1e999"`},
		{"atol=-1", "atol value -1 is outside"},
		{"cosine=1.5", "cosine value 1.5 is outside [0, 1]"},
		{"top1=-0.1", "top1 value -0.1"},
		{"allow_non_finite=yes", `allow_non_finite value "yes"`},
		{":cosine=0.9", "empty model"},
		{"/logits:cosine=0.9", "empty model"},
		{"m/:cosine=0.9", "empty output"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, err := ParseOverride(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseOverride(%q) = %v, want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func FuzzParseOverride(f *testing.F) {
	for _, s := range []string{
		"cosine=0.995", "det_onnx_fp16:cosine=0.99", "det_onnx_fp16/sigmoid_0.tmp_0:rtol=0.05",
		"*/logits:top1=0.97", "*:top5=1", "m/*:agreement=0", "m/Identity:0:atol=1e-3", "a:b/c/d:e:atol=0x1p-3",
		"allow_non_finite=T", "worst_cosine=-0", "rtol=1e308", ":x", "m/:cosine=1", "a=b:c=d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseOverride(s)
		if err != nil {
			return
		}
		back, err := ParseOverride(o.String())
		if err != nil || back != o {
			t.Errorf("ParseOverride(%q) = %+v; ParseOverride(%q) = %+v, %v, want the same", s, o, o.String(), back, err)
		}
	})
}

func TestResolve(t *testing.T) {
	base := Defaults("fp16")
	overrides := []Override{
		{Model: "m", Output: "o", Metric: "cosine", Value: 0.5},
		{Metric: "cosine", Value: 0.9},
		{Model: "m", Metric: "cosine", Value: 0.8},
		{Output: "o", Metric: "cosine", Value: 0.7},
		{Model: "n", Metric: "cosine", Value: 0.6},
		{Model: "n", Metric: "rtol", Value: 0.05},
		{Model: "n", Metric: "allow_non_finite", Value: 1},
		{Model: "n", Metric: "bogus", Value: 1},
	}
	for _, tc := range []struct {
		model, output string
		want          func(*Thresholds)
	}{
		{"m", "o", func(t *Thresholds) { t.MinCosine = 0.5 }}, // model and output, though listed first
		{"m", "x", func(t *Thresholds) { t.MinCosine = 0.8 }}, // model over none
		{"x", "o", func(t *Thresholds) { t.MinCosine = 0.7 }}, // output over none
		{"x", "x", func(t *Thresholds) { t.MinCosine = 0.9 }}, // none
		{"n", "o", func(t *Thresholds) { // output-only and model-only tie: the later wins
			t.MinCosine, t.RTol, t.ToleranceAdvisory, t.AllowNonFinite = 0.6, 0.05, false, true
		}},
	} {
		t.Run(tc.model+"/"+tc.output, func(t *testing.T) {
			want := base
			tc.want(&want)
			if got := Resolve(base, overrides, tc.model, tc.output); got != want {
				t.Errorf("Resolve(fp16, %s, %s) = %+v, want %+v", tc.model, tc.output, got, want)
			}
		})
	}
	if got := Resolve(base, nil, "m", "o"); got != base {
		t.Errorf("Resolve(fp16, nil) = %+v, want %+v", got, base)
	}
}
