package convert

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"
)

// trtexecCorpus is the directory of real trtexec logs, shared by the
// project and never copied into the repository.
const trtexecCorpus = "../../shared/corpus/trt-logs/trtexec"

// corpusFile returns the path of a corpus file, skipping the test when the
// corpus is not checked out next to the repository.
func corpusFile(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(trtexecCorpus, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("trtexec corpus not available (%v); it lives in shared/corpus/trt-logs next to the repository", err)
	}
	return p
}

// corpusLogs are the trtexec console logs of the corpus with the version
// their banner carries.
var corpusLogs = []struct {
	name    string
	version TRTVersion
	build   string
}{
	{"trt10.16_result-01.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-02.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-03.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-04.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-05.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-06.log", TRTVersion{10, 16, 1}, "11"},
	{"trt10.16_result-08.log", TRTVersion{10, 16, 1}, "11"},
	{"trt8.2_result-FP16_FAILED.log", TRTVersion{8, 2, 3}, ""},
	{"trt8.4_result-FP16.log", TRTVersion{8, 4, 1}, ""},
	{"trt8.4_result-FP32.log", TRTVersion{8, 4, 1}, ""},
	{"trt10.16_trtexec_help.txt", TRTVersion{10, 16, 1}, "11"},
}

func TestVersionFromNumber(t *testing.T) {
	tests := []struct {
		in      string
		want    TRTVersion
		wantErr bool
	}{
		{"8502", TRTVersion{8, 5, 2}, false},
		{"8601", TRTVersion{8, 6, 1}, false},
		{"8401", TRTVersion{8, 4, 1}, false},
		{"8203", TRTVersion{8, 2, 3}, false},
		{"7103", TRTVersion{7, 1, 3}, false},
		{"9300", TRTVersion{9, 3, 0}, false},
		{"100300", TRTVersion{10, 3, 0}, false},
		{"101601", TRTVersion{10, 16, 1}, false},
		{"100001", TRTVersion{10, 0, 1}, false},
		{"110000", TRTVersion{11, 0, 0}, false},
		{"", TRTVersion{}, true},
		{"v8601", TRTVersion{}, true},
		{"12345", TRTVersion{}, true},
		{"0", TRTVersion{}, true},
		{"-8601", TRTVersion{}, true},
		{"99999999", TRTVersion{}, true},
	}
	for _, tt := range tests {
		got, err := VersionFromNumber(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("VersionFromNumber(%q) = %v, %v, want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err == nil {
			if n := got.CacheVersion(); n != atoi(tt.in) {
				t.Errorf("(%v).CacheVersion() = %d, want %s", got, n, tt.in)
			}
		}
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func TestTRTVersionString(t *testing.T) {
	tests := []struct {
		v         TRTVersion
		want      string
		wantCache int
	}{
		{TRTVersion{10, 3, 0}, "10.3.0", 100300},
		{TRTVersion{8, 6, 1}, "8.6.1", 8601},
		{TRTVersion{10, 16, 1}, "10.16.1", 101601},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("(%#v).String() = %q, want %q", tt.v, got, tt.want)
		}
		if got := tt.v.CacheVersion(); got != tt.wantCache {
			t.Errorf("(%#v).CacheVersion() = %d, want %d", tt.v, got, tt.wantCache)
		}
	}
}

func TestParseVersionSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    VersionSpec
		wantErr bool
	}{
		{"10.3", VersionSpec{10, 3, 0, false}, false},
		{"10.3.0", VersionSpec{10, 3, 0, true}, false},
		{"8.6.1", VersionSpec{8, 6, 1, true}, false},
		{"v10.16.1", VersionSpec{10, 16, 1, true}, false},
		{"10", VersionSpec{}, true},
		{"10.3.0.1", VersionSpec{}, true},
		{"10.x", VersionSpec{}, true},
		{"0.3", VersionSpec{}, true},
		{"10.03", VersionSpec{}, true},
		{"", VersionSpec{}, true},
	}
	for _, tt := range tests {
		got, err := ParseVersionSpec(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseVersionSpec(%q) = %+v, %v, want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	spec, _ := ParseVersionSpec("10.3")
	for _, v := range []TRTVersion{{10, 3, 0}, {10, 3, 1}} {
		if !spec.Match(v) {
			t.Errorf("VersionSpec 10.3 .Match(%v) = false, want true", v)
		}
	}
	if spec.Match(TRTVersion{10, 4, 0}) {
		t.Errorf("VersionSpec 10.3 .Match(10.4.0) = true, want false")
	}
	exact, _ := ParseVersionSpec("10.3.1")
	if exact.Match(TRTVersion{10, 3, 0}) {
		t.Errorf("VersionSpec 10.3.1 .Match(10.3.0) = true, want false")
	}
	if v, err := ParseTRTVersion("8.6.1"); err != nil || v != (TRTVersion{8, 6, 1}) {
		t.Errorf("ParseTRTVersion(8.6.1) = %v, %v", v, err)
	}
}

func TestParseBannerCorpus(t *testing.T) {
	for _, c := range corpusLogs {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Open(corpusFile(t, c.name))
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
			Banner{"RUNNING", "TensorRT.trtexec", TRTVersion{10, 3, 0}, "17", "trtexec --onnx=m.onnx"}, false},
		{"&&&& PASSED TensorRT.trtexec [TensorRT v8502] # trtexec",
			Banner{"PASSED", "TensorRT.trtexec", TRTVersion{8, 5, 2}, "", "trtexec"}, false},
		{"&&&& FAILED TensorRT.trtexec [TensorRT v8601]",
			Banner{"FAILED", "TensorRT.trtexec", TRTVersion{8, 6, 1}, "", ""}, false},
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
