package calibrate

import (
	"context"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testutil"
)

// The clip limit on real data: PP-OCRv4 det's input (ImageNet-normalised
// RGB) over printed pages rendered from Debian's manuals. Without the limit
// the entropy cut clips most of the tensor, which took the int8 detector's
// cosine against fp32 to 0.04; with it at most 1% is clipped.
func TestEntropyClipLimitOnPages(t *testing.T) {
	pages := testutil.DocPages(t)
	pre, err := dataset.ParsePreprocess("resize=640x640,scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := dataset.Open(ctx, dataset.Spec{Path: pages, Preprocess: pre}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHistogram()
	for i := 0; i < min(6, src.Len()); i++ {
		s, err := src.Sample(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range s.Tensors {
			if err := h.Add(x.Data.([]float32)); err != nil {
				t.Fatal(err)
			}
		}
	}
	trt := compute(t, Entropy, h, MethodOptions{EntropyMaxClip: -1})
	limited := compute(t, Entropy, h, MethodOptions{})
	cut := func(r Range) float64 {
		for i := 0; i <= h.Bins(); i++ {
			if h.Edge(i) >= r.Amax {
				return clipped(h, i)
			}
		}
		return 0
	}
	if c := cut(trt); c < 25 {
		t.Errorf("unbounded entropy on the pages clips %.2f%% (amax %v); want the degenerate cut (> 25%%) the limit is for", c, trt.Amax)
	}
	if c := cut(limited); c > DefaultEntropyMaxClip {
		t.Errorf("entropy with the default limit clips %.3f%% of the pages' values (amax %v), want at most %v%%", c, limited.Amax, DefaultEntropyMaxClip)
	}
}
