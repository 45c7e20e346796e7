package onnx

import (
	"reflect"
	"testing"
)

func TestRandom(t *testing.T) {
	a, err := Random("x", Float, []int64{2, 3}, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Random("x", Float, []int64{2, 3}, 7)
	c, _ := Random("x", Float, []int64{2, 3}, 8)
	if !reflect.DeepEqual(a, b) || reflect.DeepEqual(a.Data, c.Data) {
		t.Errorf("Random is not determined by its seed: %v %v %v", a.Data, b.Data, c.Data)
	}
	for _, v := range a.Data.([]float32) {
		if v < 0 || v >= 1 {
			t.Errorf("Random float %v not in [0,1)", v)
		}
	}
	for _, dt := range []DataType{Int64, Int32, Uint8, Bool, Float16, BFloat16, Double, String} {
		r, err := Random("x", dt, []int64{4}, 1)
		if err != nil || r.Len() != 4 || r.Type != dt {
			t.Errorf("Random(%s) = %+v, %v; want 4 elements of the type", dt, r, err)
			continue
		}
		if dt == Int64 && !reflect.DeepEqual(r.Data, []int64{0, 0, 0, 0}) {
			t.Errorf("Random(int64) = %v, want zeros (a safe index)", r.Data)
		}
	}
	if _, err := Random("x", Complex64, []int64{1}, 1); err == nil {
		t.Error("Random(complex64) did not refuse")
	}
}
