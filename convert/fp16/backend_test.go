package fp16

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// The backend-suite tolerance. An fp16 output matches its fp32 reference
// when every finite element satisfies
//
//	|got - ref| <= suiteRTol·max|ref| + suiteATol
//
// (the output's largest magnitude scales the bound: float16 rounds each
// value to 2^-11 relative and sums that cancel keep errors the size of
// their terms), non-finite elements are identical (NaN matching NaN), and
// integer and bool outputs are equal. An output that misses this bound but
// has cosine >= fp16MinCosine with its reference still passes: long
// reductions in float16 (the suite's RNNs, softmax-cross-entropy over
// many classes) drift elementwise while keeping their direction.
const (
	suiteRTol = 1e-2
	suiteATol = 1e-3
)

// suiteCase is one backend-suite test directory.
type suiteCase struct{ name, dir string }

func backendSuiteCases(t testing.TB) []suiteCase {
	root := testutil.BackendSuite(t)
	var out []suiteCase
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if _, err := os.Stat(filepath.Join(p, "model.onnx")); err != nil {
			return nil
		}
		if _, err := os.Stat(filepath.Join(p, "test_data_set_0")); err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, suiteCase{filepath.ToSlash(rel), p})
		return filepath.SkipDir
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// suiteInputs reads test_data_set_0's inputs, keyed by the model's
// non-initializer inputs in order.
func suiteInputs(t testing.TB, m *onnx.Model, dir string) (map[string]*onnx.Tensor, bool) {
	in := map[string]*onnx.Tensor{}
	for i, v := range m.Inputs() {
		p := filepath.Join(dir, "test_data_set_0", "input_"+strconv.Itoa(i)+".pb")
		if _, err := os.Stat(p); err != nil {
			return nil, false // an optional input left out, or a sequence
		}
		x, err := readTensor(p)
		if err != nil {
			return nil, false // a sequence or optional serialized as a tensor
		}
		in[v.Name] = x
	}
	return in, true
}

// readTensor is ortest.ReadTensor returning the error: the suite stores
// sequences and optionals in .pb files that do not decode as tensors.
func readTensor(path string) (*onnx.Tensor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := &onnxpb.TensorProto{}
	if err := proto.Unmarshal(b, p); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	return onnx.Decode(p)
}

// suiteOutcome is what happened to one backend-suite model.
type suiteOutcome int

const (
	outNotRunnable suiteOutcome = iota // ORT does not run the fp32 model (or not deterministically)
	outPassed
	outRefused
	outFailed
)

// TestBackendSuiteFP16 converts every model of ONNX 1.12's backend test
// suite that ONNX Runtime runs in float32 and requires that either the
// float16 model loads at ORT's highest optimization level and matches the
// float32 outputs (see suiteRTol), or Convert refuses the model with a
// typed error (*UnsupportedError or ErrAlreadyFloat16).
func TestBackendSuiteFP16(t *testing.T) {
	initORT(t)
	cases := backendSuiteCases(t)
	counts := map[suiteOutcome]int{}
	refused := map[string][]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, why := runSuiteCase(t, tc)
			counts[out]++
			if out == outRefused {
				refused[why] = append(refused[why], tc.name)
			}
		})
	}
	runnable := counts[outPassed] + counts[outRefused] + counts[outFailed]
	t.Logf("%d models: %d run in fp32 (%d pass after fp16, %d refused, %d fail), %d not run by ORT in fp32",
		len(cases), runnable, counts[outPassed], counts[outRefused], counts[outFailed], counts[outNotRunnable])
	reasons := make([]string, 0, len(refused))
	for r := range refused {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		t.Logf("refused (%s): %s", r, strings.Join(refused[r], " "))
	}
}

func runSuiteCase(t *testing.T, tc suiteCase) (suiteOutcome, string) {
	m, err := onnx.Load(filepath.Join(tc.dir, "model.onnx"))
	if err != nil {
		return outNotRunnable, ""
	}
	in, ok := suiteInputs(t, m, tc.dir)
	if !ok {
		return outNotRunnable, ""
	}
	want, err := runModel(m, in)
	if err != nil {
		return outNotRunnable, ""
	}
	if again, err := runModel(m, in); err != nil || !sameOutputs(want, again) {
		return outNotRunnable, "" // random operators: nothing to compare with
	}
	h, _, err := Convert(m, Options{KeepIOTypes: true})
	if err != nil {
		var ue *UnsupportedError
		switch {
		case errors.As(err, &ue):
			return outRefused, ue.Reason
		case errors.Is(err, ErrAlreadyFloat16):
			return outRefused, "already float16"
		}
		t.Errorf("Convert = %v, want success or a typed refusal", err)
		return outFailed, ""
	}
	got, err := runModel(h, in)
	if err != nil {
		t.Errorf("running the fp16 model: %v", err)
		return outFailed, ""
	}
	failed := false
	for name, w := range want {
		if msg := suiteMismatch(t, got[name], w); msg != "" {
			t.Errorf("output %q: %s", name, msg)
			failed = true
		}
	}
	if failed {
		return outFailed, ""
	}
	return outPassed, ""
}

func sameOutputs(a, b map[string]*onnx.Tensor) bool {
	if len(a) != len(b) {
		return false
	}
	for name, x := range a {
		y, ok := b[name]
		if !ok || !reflect.DeepEqual(x.Dims, y.Dims) {
			return false
		}
		xs, err1 := x.Float64s()
		ys, err2 := y.Float64s()
		if err1 != nil || err2 != nil {
			if !reflect.DeepEqual(x.Data, y.Data) {
				return false
			}
			continue
		}
		for i := range xs {
			if xs[i] != ys[i] && !(math.IsNaN(xs[i]) && math.IsNaN(ys[i])) {
				return false
			}
		}
	}
	return true
}

// suiteMismatch says how got misses want under the suite's tolerance, or
// "" when it matches.
func suiteMismatch(t testing.TB, got, want *onnx.Tensor) string {
	if got == nil {
		return "missing"
	}
	if got.Type != want.Type || !reflect.DeepEqual(got.Dims, want.Dims) {
		return fmt.Sprintf("%s%v, want %s%v", got.Type, got.Dims, want.Type, want.Dims)
	}
	if !want.Type.IsFloat() {
		if !reflect.DeepEqual(got.Data, want.Data) {
			return fmt.Sprintf("= %v, want %v exactly", clip(got.Data), clip(want.Data))
		}
		return ""
	}
	g, w := float64Pair(t, got, want)
	scale := 0.0
	for _, v := range w {
		if !math.IsInf(v, 0) && !math.IsNaN(v) {
			scale = math.Max(scale, math.Abs(v))
		}
	}
	tol := suiteRTol*scale + suiteATol
	bad, worst, nonFinite := 0, 0.0, 0
	var dot, gg, ww float64
	for i := range w {
		if math.IsInf(w[i], 0) || math.IsNaN(w[i]) || math.IsInf(g[i], 0) || math.IsNaN(g[i]) {
			if !(math.IsNaN(w[i]) && math.IsNaN(g[i])) && g[i] != w[i] {
				nonFinite++
			}
			continue
		}
		d := math.Abs(g[i] - w[i])
		if d > tol {
			bad++
		}
		worst = math.Max(worst, d)
		dot, gg, ww = dot+g[i]*w[i], gg+g[i]*g[i], ww+w[i]*w[i]
	}
	cos := 1.0
	if gg > 0 && ww > 0 {
		cos = dot / math.Sqrt(gg*ww)
	} else if gg != ww {
		cos = 0
	}
	switch {
	case nonFinite > 0:
		return fmt.Sprintf("%d of %d non-finite values differ", nonFinite, len(w))
	case bad > 0 && cos < fp16MinCosine:
		return fmt.Sprintf("%d of %d values off by more than %.3g (max abs error %.3g, cosine %.6f)", bad, len(w), tol, worst, cos)
	}
	return ""
}

func clip(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
