package check

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/onnx"
)

func dynamic(n int) onnx.Shape {
	return onnx.Shape{Ranked: true, Dims: make([]onnx.Dim, n)}
}

// Random data for an input with no rank is refused naming the input and
// --shape (ONNX Runtime would refuse its 0-d tensor with "The shape has no
// dimensions"); a -1 in a given shape takes the model's size there.
func TestRandomFeedShapes(t *testing.T) {
	unranked := []onnx.ValueInfo{{Name: "X", Type: onnx.Float}}
	for _, shapes := range []map[string][]int64{nil, {"X": {-1}}} {
		_, _, err := Feeds(context.Background(), FeedSpec{Inputs: unranked, Shapes: shapes, Samples: 1})
		var se *ShapeError
		if !errors.As(err, &se) || !se.Unranked || !strings.Contains(err.Error(), `input "X" has no known rank`) || !strings.Contains(err.Error(), "--shape X=") {
			t.Errorf("Shapes %v: error %v, want a ShapeError naming X and --shape", shapes, err)
		}
	}
	feeds, _, err := Feeds(context.Background(), FeedSpec{Inputs: unranked, Shapes: map[string][]int64{"X": {16}}, Samples: 1})
	if err != nil || !slices.Equal(feeds[0].Tensors["X"].Dims, []int64{16}) {
		t.Errorf("X=16 on an unranked input: %v, want a [16] tensor", err)
	}

	sig := []onnx.ValueInfo{{Name: "x", Type: onnx.Float, Shape: dynamic(2)}}
	feeds, _, err = Feeds(context.Background(), FeedSpec{Inputs: sig, Shapes: map[string][]int64{"x": {-1, 5}}, Samples: 2, Batch: 2})
	if err != nil || !slices.Equal(feeds[0].Tensors["x"].Dims, []int64{2, 5}) {
		t.Errorf("x=-1x5 on [?,?] with batch 2: %v, want [2 5]", err)
	}
	if _, _, err := Feeds(context.Background(), FeedSpec{Inputs: sig, Shapes: map[string][]int64{"x": {-1, 5, 1}}, Samples: 1}); err == nil || !strings.Contains(err.Error(), "3 dimensions") {
		t.Errorf("x=-1x5x1 on a rank-2 input: %v, want a rank error", err)
	}
}
