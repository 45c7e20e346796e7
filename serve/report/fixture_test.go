package report

import (
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

func ptr[T any](v T) *T { return &v }

// perfCurve is a CPU-like measurement: latency grows with concurrency once
// the cores are busy, throughput flattens.
func perfCurve(p50 float64) *Perf {
	p := &Perf{Warmup: 50, MeasurementWindow: 5 * time.Second,
		Overhead: LoopOverhead{PerRequestUS: 6.5, Share: 6.5 / (p50 * 1.04)}}
	for i, c := range []int{1, 2, 4, 8} {
		scale := []float64{1, 1.15, 1.6, 2.9}[i]
		l := p50 * scale
		p.Points = append(p.Points, PerfPoint{
			Concurrency: c, Batch: 1, Requests: int(5e6 / l * float64(c)),
			ThroughputInferPerSec: 1e6 / (l * 1.04) * float64(c),
			LatencyAvgUS:          l * 1.04, LatencyP50US: l, LatencyP90US: l * 1.22, LatencyP95US: l * 1.35,
			LatencyP99US: l * 1.7, LatencyMinUS: l * 0.81, LatencyMaxUS: l * 3.1,
		})
	}
	return p
}

// tinynet is the report of `kiln serve` on the repository kiln's demo
// builds: fp32 reference, fp16 close to it, int8 out of bounds on one
// image, and a TensorRT engine that needs a GPU this machine lacks.
func tinynet() *Report {
	r := &Report{
		SchemaVersion: SchemaVersion,
		Tool:          "kiln 0.4.0",
		Created:       time.Date(2026, 3, 2, 10, 15, 0, 0, time.UTC),
		Subject:       ".cache/demo/repo",
		Device:        "cpu",
		ORTVersion:    "1.24.1",
		Data: Data{Kind: KindDataset, Path: ".cache/demo/images", Samples: 64,
			Digest: "sha256:9f2c4e1b7a3d5f60e8c1b2a4d6f8091a3c5e7b9d1f2a4c6e8b0d2f4a6c8e0b1d"},
		Models: []Model{
			{
				Name: "tinynet_onnx_fp32", Version: "1", Variant: "onnx-fp32", Runtime: "onnx", Precision: "fp32",
				Platform: "onnxruntime_onnx", Path: "tinynet_onnx_fp32/1/model.onnx", Size: 1_234_567,
				Verdict: Pass, Perf: perfCurve(812),
			},
			{
				Name: "tinynet_onnx_fp16", Version: "1", Variant: "onnx-fp16", Runtime: "onnx", Precision: "fp16",
				Platform: "onnxruntime_onnx", Path: "tinynet_onnx_fp16/1/model.onnx", Size: 618_904,
				Verdict: Pass, Reference: "tinynet_onnx_fp32",
				Outputs: []check.Metrics{{
					Output: "logits", Kind: check.KindClassifier, Samples: 64, Elements: 640,
					MaxAbs: 0.0021, MaxRel: 0.0043, MeanAbs: 0.00031,
					Cosine: 0.999996, WorstCosine: 0.99998, WorstSample: "images/dog_003.png",
					Top1: ptr(1.0), Top5: ptr(1.0), MinATol: 0.0021, MinRTol: 0.0043,
				}},
				Thresholds: map[string]check.Thresholds{"logits": {ATol: 0.01, RTol: 0.01, MinWorstCosine: 0.999, MinTop1: 0.99}},
				Perf:       perfCurve(1450),
			},
			{
				Name: "tinynet_onnx_int8", Version: "1", Variant: "onnx-int8", Runtime: "onnx", Precision: "int8",
				Platform: "onnxruntime_onnx", Path: "tinynet_onnx_int8/1/model.onnx", Size: 342_112,
				Verdict: Fail, Reference: "tinynet_onnx_fp32",
				Outputs: []check.Metrics{{
					Output: "logits", Kind: check.KindClassifier, Samples: 64, Elements: 640,
					MaxAbs: 0.31, MaxRel: 0.52, MeanAbs: 0.041,
					Cosine: 0.9961, WorstCosine: 0.981, WorstSample: "images/cat_012.png",
					Top1: ptr(0.953125), Top5: ptr(1.0), MinATol: 0.31, MinRTol: 0.52,
				}},
				Thresholds: map[string]check.Thresholds{"logits": {MinWorstCosine: 0.99, MinTop1: 0.95}},
				Failures:   []check.Failure{{Output: "logits", Metric: "worst_cosine", Value: 0.981, Threshold: 0.99, Sample: "images/cat_012.png"}},
				Perf:       perfCurve(520),
			},
			{
				Name: "tinynet_trt_fp16", Version: "1", Variant: "trt-fp16", Runtime: "trt", Precision: "fp16",
				Platform: "tensorrt_plan", Path: "tinynet_trt_fp16/1/model.plan",
				Verdict: NotChecked, Reason: "needs GPU/TensorRT (trtexec not found)", Reference: "tinynet_onnx_fp32",
			},
		},
	}
	r.Summarize()
	return r
}

// randomData is tinynet checked on seeded random inputs: fp16 passes, int8
// cannot be judged.
func randomData() *Report {
	r := tinynet()
	r.Data = Data{Kind: KindRandom, Samples: 16, Seed: 42, Note: "no --data given"}
	r.Models = r.Models[:3]
	m := &r.Models[2]
	m.Verdict, m.Reason, m.Failures = NotJudged, "needs real data", nil
	r.Summarize()
	return r
}

// empty is a report of a repository where nothing could be loaded.
func empty() *Report {
	r := &Report{SchemaVersion: SchemaVersion, Tool: "kiln 0.4.0", Subject: "gs://models-prod/tinynet",
		Created: time.Date(2026, 3, 2, 10, 15, 0, 0, time.UTC), Device: "triton http://localhost:8000",
		Data: Data{Kind: KindInputs, Path: "inputs.npz", Samples: 1}}
	r.Summarize()
	return r
}

// hostile has names and errors that try to break out of every format.
func hostile() *Report {
	r := tinynet()
	r.Subject = `repo/<script>alert("s")</script>`
	r.Models[1].Name = `<img src=x onerror=alert(1)>|**bold**`
	r.Models[2].Name = "int8 `code` [link](javascript:alert(1)) _em_ & </svg>"
	r.Models[2].Failures[0].Sample = "images/<b>cat</b>|x.png"
	r.Models[3].Reason = "load error:\n<iframe src=//evil> # heading\n| table |"
	r.Models[3].Size = 99
	return r
}
