package report

import (
	"math"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestSummarize(t *testing.T) {
	fail := []check.Failure{{Output: "y", Metric: "cosine", Value: 0.9, Threshold: 0.99}}
	tests := []struct {
		name     string
		models   []Model
		want     Verdict
		wantExit int
	}{
		{"all pass", []Model{{Verdict: Pass}, {Verdict: Pass}}, Pass, 0},
		{"no models", nil, NotChecked, 4},
		{"one fail", []Model{{Verdict: Pass}, {Verdict: Fail}, {Verdict: NotChecked}}, Fail, 3},
		{"fail beats error", []Model{{Verdict: Errored}, {Verdict: Fail}}, Fail, 3},
		{"load error", []Model{{Verdict: Pass}, {Verdict: Errored}}, Errored, 3},
		{"error beats not-checked", []Model{{Verdict: NotChecked}, {Verdict: Errored}}, Errored, 3},
		{"needs GPU", []Model{{Verdict: Pass}, {Verdict: NotChecked}}, NotChecked, 4},
		{"random data for int8", []Model{{Verdict: Pass}, {Verdict: NotJudged}}, NotJudged, 4},
		{"not-checked beats not-judged", []Model{{Verdict: NotJudged}, {Verdict: NotChecked}}, NotChecked, 4},
		{"failures override pass", []Model{{Verdict: Pass, Failures: fail}}, Fail, 3},
		{"failures fill an empty verdict", []Model{{Failures: fail}}, Fail, 3},
		{"empty verdict is not checked", []Model{{Verdict: Pass}, {}}, NotChecked, 4},
		{"unknown verdict is not checked", []Model{{Verdict: "maybe"}}, NotChecked, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{Models: tt.models}
			r.Summarize()
			if r.Verdict != tt.want || r.ExitCode() != tt.wantExit {
				t.Errorf("Summarize() = %q, exit %d; want %q, exit %d", r.Verdict, r.ExitCode(), tt.want, tt.wantExit)
			}
			if r.SchemaVersion != SchemaVersion {
				t.Errorf("SchemaVersion = %d, want %d", r.SchemaVersion, SchemaVersion)
			}
		})
	}
}

func TestSummarizeFixtures(t *testing.T) {
	for _, tt := range []struct {
		name     string
		r        *Report
		want     Verdict
		wantExit int
	}{
		{"tinynet", tinynet(), Fail, 3},
		{"random", randomData(), NotJudged, 4},
		{"empty", empty(), NotChecked, 4},
	} {
		if tt.r.Verdict != tt.want || tt.r.ExitCode() != tt.wantExit {
			t.Errorf("%s: verdict %q exit %d, want %q exit %d", tt.name, tt.r.Verdict, tt.r.ExitCode(), tt.want, tt.wantExit)
		}
	}
}

func TestWorst(t *testing.T) {
	cos := check.Failure{Output: "logits", Metric: "worst_cosine", Value: 0.981, Threshold: 0.99}
	abs := check.Failure{Output: "logits", Metric: "tolerance", Value: 0.41, Threshold: 0.35}
	nan := check.Failure{Output: "boxes", Metric: "nan", Value: 3, Threshold: 0} // the reference has none
	nanCos := check.Failure{Output: "boxes", Metric: "worst_cosine", Value: math.NaN(), Threshold: 0.99}
	norm := check.Failure{Output: "probs", Metric: "norm_deviation", Value: 0.38, Threshold: 0.01}
	cos2 := check.Failure{Output: "probs", Metric: "worst_cosine", Value: 0.5, Threshold: 0.99}
	tests := []struct {
		name string
		fs   []check.Failure
		want *check.Failure
	}{
		{"none", nil, nil},
		{"one", []check.Failure{cos}, &cos},
		{"cosine before tolerance", []check.Failure{abs, cos}, &cos}, // though 0.9% vs 17%
		{"cosine before magnitude", []check.Failure{norm, cos}, &cos},
		{"largest relative miss of one metric", []check.Failure{cos, cos2}, &cos2},
		{"zero threshold is infinitely missed", []check.Failure{abs, nan}, &nan},
		{"NaN value is infinitely missed", []check.Failure{cos, nanCos}, &nanCos},
		{"ties go to the first", []check.Failure{nan, nanCos}, &nan},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Model{Failures: tt.fs}
			got := m.Worst()
			switch {
			case tt.want == nil && got != nil:
				t.Errorf("Worst() = %+v, want nil", *got)
			case tt.want != nil && (got == nil || got.Output != tt.want.Output || got.Metric != tt.want.Metric):
				t.Errorf("Worst() = %+v, want %+v", got, *tt.want)
			}
		})
	}
}

func TestDataLabel(t *testing.T) {
	tests := []struct {
		d    Data
		want string
	}{
		{Data{Kind: KindRandom, Seed: 7, Samples: 16}, "inputs: seeded random data (seed 7) — accuracy of int8 not judged"},
		{Data{Kind: KindDataset, Path: "gs://b/imgs", Samples: 64, Digest: "sha256:0123456789abcdef0123"},
			"inputs: dataset gs://b/imgs (64 samples, sha256:0123456789ab…)"},
		{Data{Kind: KindValidationSplit, Path: "calib/", Samples: 32}, "inputs: held-out validation split of calib/ (32 samples)"},
		{Data{Kind: KindInputs, Path: "x.npz", Samples: 1}, "inputs: tensors from x.npz (1 sample)"},
		{Data{Kind: "bogus"}, `inputs: "bogus" (unknown kind)`},
	}
	for _, tt := range tests {
		if got := tt.d.Label(); got != tt.want {
			t.Errorf("Data{%s}.Label() = %q, want %q", tt.d.Kind, got, tt.want)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{latency(812.4), "812 µs"},
		{latency(1380.3), "1.38 ms"},
		{latency(2.5e6), "2.5 s"},
		{bytesIEC(99), "99 B"},
		{bytesIEC(1_234_567), "1.18 MiB"},
		{bytesIEC(3 << 30), "3 GiB"},
		{num(0.99998), "0.99998"},
		{num(0.981), "0.981"},
		{throughputCell(&Perf{Points: []PerfPoint{{Concurrency: 4, Batch: 8, ThroughputInferPerSec: 912.6}}}), "913 infer/s (c4, b8)"},
		{latencyCell(&Perf{Points: []PerfPoint{{Concurrency: 2, Batch: 1}}}), "—"},
		{latencyCell(nil), "—"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
