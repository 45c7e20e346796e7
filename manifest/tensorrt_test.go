package manifest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
)

func TestTRTVersionFromNumber(t *testing.T) {
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
		{"10000", TRTVersion{}, true},
		{"0", TRTVersion{}, true},
		{"6001", TRTVersion{}, true},
		{"-8601", TRTVersion{}, true},
		{"99999999", TRTVersion{}, true},
	}
	for _, tt := range tests {
		got, err := TRTVersionFromNumber(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("TRTVersionFromNumber(%q) = %v, %v, want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err == nil {
			if n := got.Number(); strconv.Itoa(n) != tt.in {
				t.Errorf("(%v).Number() = %d, want %s", got, n, tt.in)
			}
		}
	}
}

func TestTRTVersionNumber(t *testing.T) {
	for _, tt := range []struct{ major, minor, patch, want int }{
		{7, 0, 0, 7000}, {7, 1, 3, 7103}, {8, 5, 2, 8502}, {8, 6, 0, 8600}, {8, 6, 1, 8601},
		{9, 3, 0, 9300}, {10, 0, 1, 100001}, {10, 3, 0, 100300}, {10, 14, 1, 101401}, {10, 16, 1, 101601}, {11, 1, 0, 110100},
	} {
		v := TRTVersion{tt.major, tt.minor, tt.patch}
		got := v.Number()
		if got != tt.want {
			t.Errorf("(%v).Number() = %d, want %d", v, got, tt.want)
		}
		back, err := TRTVersionFromNumber(strconv.Itoa(got))
		if err != nil || back != v {
			t.Errorf("TRTVersionFromNumber(%d) = %v, %v, want %v", got, back, err, v)
		}
		if s, w := v.String(), strconv.Itoa(tt.major)+"."+strconv.Itoa(tt.minor)+"."+strconv.Itoa(tt.patch); s != w {
			t.Errorf("(%#v).String() = %q, want %q", v, s, w)
		}
	}
}

// ParseTRTSpec is the one parser behind every --trt-version flag: dotted
// versions, with or without a patch release, and trtexec's banner numbers.
func TestParseTRTSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    TRTSpec
		wantErr bool
	}{
		{"10.3", TRTSpec{TRTVersion{10, 3, 0}, true}, false},
		{"10.3.0", TRTSpec{TRTVersion{10, 3, 0}, false}, false},
		{"8.6.1", TRTSpec{TRTVersion{8, 6, 1}, false}, false},
		{"8.6", TRTSpec{TRTVersion{8, 6, 0}, true}, false},
		{"v10.16.1", TRTSpec{TRTVersion{10, 16, 1}, false}, false},
		{"100300", TRTSpec{TRTVersion{10, 3, 0}, false}, false},
		{" 8601 ", TRTSpec{TRTVersion{8, 6, 1}, false}, false},
		{"10", TRTSpec{}, true},
		{"10000", TRTSpec{}, true},
		{"10.3.0.1", TRTSpec{}, true},
		{"10.x", TRTSpec{}, true},
		{"x", TRTSpec{}, true},
		{"0.3", TRTSpec{}, true},
		{"6.0.1", TRTSpec{}, true},
		{"10.03", TRTSpec{}, true},
		{"10.+3", TRTSpec{}, true},
		{"10.100", TRTSpec{}, true},
		{"7.10", TRTSpec{}, true},
		{"10.10", TRTSpec{TRTVersion{10, 10, 0}, true}, false},
		{"", TRTSpec{}, true},
	}
	for _, tt := range tests {
		got, err := ParseTRTSpec(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseTRTSpec(%q) = %+v, %v, want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		v, verr := ParseTRTVersion(tt.in)
		if (verr != nil) != tt.wantErr || v != tt.want.TRTVersion {
			t.Errorf("ParseTRTVersion(%q) = %v, %v, want %v", tt.in, v, verr, tt.want.TRTVersion)
		}
	}
	spec, _ := ParseTRTSpec("10.3")
	for _, v := range []TRTVersion{{10, 3, 0}, {10, 3, 1}} {
		if !spec.Match(v) {
			t.Errorf("TRTSpec 10.3 .Match(%v) = false, want true", v)
		}
	}
	if spec.Match(TRTVersion{10, 4, 0}) {
		t.Errorf("TRTSpec 10.3 .Match(10.4.0) = true, want false")
	}
	exact, _ := ParseTRTSpec("10.3.1")
	if exact.Match(TRTVersion{10, 3, 0}) {
		t.Errorf("TRTSpec 10.3.1 .Match(10.3.0) = true, want false")
	}
	if spec.String() != "10.3" || exact.String() != "10.3.1" {
		t.Errorf("TRTSpec.String() = %q, %q, want 10.3, 10.3.1", spec, exact)
	}
	var v TRTVersion
	if err := v.UnmarshalText([]byte("8601")); err != nil || v != (TRTVersion{8, 6, 1}) {
		t.Errorf("UnmarshalText(8601) = %v, %v", v, err)
	}
	if b, _ := v.MarshalText(); string(b) != "8.6.1" {
		t.Errorf("MarshalText = %q, want 8.6.1", b)
	}
}

var (
	bannerNumberRE = regexp.MustCompile(`\[TensorRT v(\d+)\]`)
	versionLineRE  = regexp.MustCompile(`TensorRT version: (\d+\.\d+\.\d+)`)
)

// Every banner in the corpus of real TensorRT logs decodes, round-trips
// through Number, and names the release the same log states in words
// ("TensorRT version: 10.16.1") where it does.
func TestTRTVersionCorpusBanners(t *testing.T) {
	root := testutil.Corpus(t, "trt-logs")
	banners := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		var fromBanner []TRTVersion
		var stated []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			for _, m := range bannerNumberRE.FindAllStringSubmatch(sc.Text(), -1) {
				banners++
				v, err := TRTVersionFromNumber(m[1])
				if err != nil {
					t.Errorf("%s: banner v%s: %v", path, m[1], err)
					continue
				}
				if n := strconv.Itoa(v.Number()); n != m[1] {
					t.Errorf("%s: banner v%s decodes to %v, whose number is %s", path, m[1], v, n)
				}
				fromBanner = append(fromBanner, v)
			}
			if m := versionLineRE.FindStringSubmatch(sc.Text()); m != nil {
				stated = append(stated, m[1])
			}
		}
		for _, s := range stated {
			want, err := ParseTRTVersion(s)
			if err != nil {
				t.Errorf("%s: ParseTRTVersion(%q) = %v", path, s, err)
			}
			for _, v := range fromBanner {
				if v != want {
					t.Errorf("%s: banner says %v, the log says TensorRT version %s", path, v, s)
				}
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if banners < 20 {
		t.Errorf("found %d TensorRT banners in %s, want the corpus's 21 or more", banners, root)
	}
}
