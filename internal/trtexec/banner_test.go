package trtexec

import (
	"bufio"
	"os"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/manifest"
)

// corpusLogs are the trtexec console logs of the corpus with the version
// their banner carries.
var corpusLogs = []struct {
	name    string
	version manifest.TRTVersion
	build   string
}{
	{"trt10.16_result-01.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-02.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-03.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-04.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-05.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-06.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt10.16_result-08.log", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
	{"trt8.2_result-FP16_FAILED.log", manifest.TRTVersion{Major: 8, Minor: 2, Patch: 3}, ""},
	{"trt8.4_result-FP16.log", manifest.TRTVersion{Major: 8, Minor: 4, Patch: 1}, ""},
	{"trt8.4_result-FP32.log", manifest.TRTVersion{Major: 8, Minor: 4, Patch: 1}, ""},
	{"trt10.16_trtexec_help.txt", manifest.TRTVersion{Major: 10, Minor: 16, Patch: 1}, "11"},
}

func TestParseBannerCorpus(t *testing.T) {
	for _, c := range corpusLogs {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Open(testutil.Corpus(t, "trt-logs", "trtexec", c.name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Scan()
			b, err := ParseBanner(sc.Text())
			if err != nil {
				t.Fatalf("ParseBanner(first line) error %v", err)
			}
			if b.Version != c.version || b.Build != c.build || b.Status != "RUNNING" || b.Test != "TensorRT.trtexec" {
				t.Errorf("ParseBanner(first line) = %+v, want version %v build %q RUNNING", b, c.version, c.build)
			}
		})
	}
}

func TestParseBanner(t *testing.T) {
	tests := []struct {
		line    string
		want    Banner
		wantErr bool
	}{
		{"&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [b17] # trtexec --onnx=m.onnx",
			Banner{"RUNNING", "TensorRT.trtexec", manifest.TRTVersion{Major: 10, Minor: 3, Patch: 0}, "17", "trtexec --onnx=m.onnx"}, false},
		{"&&&& PASSED TensorRT.trtexec [TensorRT v8502] # trtexec",
			Banner{"PASSED", "TensorRT.trtexec", manifest.TRTVersion{Major: 8, Minor: 5, Patch: 2}, "", "trtexec"}, false},
		{"&&&& FAILED TensorRT.trtexec [TensorRT v8601]",
			Banner{"FAILED", "TensorRT.trtexec", manifest.TRTVersion{Major: 8, Minor: 6, Patch: 1}, "", ""}, false},
		{"&&&& RUNNING TensorRT.trtexec [TensorRT v12345] # x", Banner{}, true},
		{"[I] TensorRT version: 10.16.1", Banner{}, true},
		{"&&&& DONE TensorRT.trtexec [TensorRT v8601] # x", Banner{}, true},
	}
	for _, tt := range tests {
		got, err := ParseBanner(tt.line)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseBanner(%q) = %+v, %v, want %+v, error %v", tt.line, got, err, tt.want, tt.wantErr)
		}
	}
}
