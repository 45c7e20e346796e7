package calibrate

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// TestCollectMemoryBudget: a memory budget that splits every run into
// groups of tensors, each run of its own, gives byte-identical ranges to
// unsplit runs. Graph optimizations are off: with them ONNX Runtime fuses
// differently when other tensors are exposed, which moves values in the
// last bits (see TestScopeQDQModelIdentical).
func TestCollectMemoryBudget(t *testing.T) {
	initORT(t)
	m := &onnx.Model{Proto: testmodels.ResNetish(16, 1)}
	var batches []*dataset.Batch
	for i := range 2 {
		batches = append(batches, batchesOf(t, memSource{input: "images", dims: []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, seed: uint64(i + 1), n: 24}, m.Inputs())...)
	}
	ranges := func(budget int64, scope Scope) string {
		return collectedRanges(t, m, batches, CollectOptions{MemoryBudget: budget, Scope: scope, Session: ort.SessionOptions{OptLevel: ort.OptDisabled}})
	}
	for _, scope := range []Scope{ScopeQDQ, ScopeAll} {
		whole := ranges(0, scope)
		for _, budget := range []int64{1, 256 << 10} {
			if got := ranges(budget, scope); got != whole {
				t.Errorf("scope %s, budget %d: ranges differ from unsplit runs", scope, budget)
			}
		}
	}
}

// collectedRanges collects batches with opts and returns the entropy
// ranges as JSON.
func collectedRanges(t *testing.T, m *onnx.Model, batches []*dataset.Batch, opts CollectOptions) string {
	t.Helper()
	st, err := Collect(context.Background(), m, replay(batches), opts)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, st)
	r, err := st.Ranges(Entropy, MethodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFetchGroups(t *testing.T) {
	per := map[string]int{"a": 10, "b": 10, "c": 30, "d": 5}
	names := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		budget int64
		want   [][]string
	}{
		{0, [][]string{names}},
		{110, [][]string{names}},
		{40, [][]string{{"a", "b"}, {"c"}, {"d"}}},
		{1, [][]string{{"a"}, {"b"}, {"c"}, {"d"}}},
	} {
		got := fetchGroups(names, per, 2, tc.budget)
		if !slices.EqualFunc(got, tc.want, slices.Equal[[]string]) {
			t.Errorf("budget %d: %v, want %v", tc.budget, got, tc.want)
		}
	}
}
