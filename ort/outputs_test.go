package ort_test

import (
	"context"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
	"github.com/x448/float16"
	"google.golang.org/protobuf/proto"
)

// cloneData copies a tensor's data slice.
func cloneData(d any) any {
	v := reflect.ValueOf(d)
	c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
	reflect.Copy(c, v)
	return c.Interface()
}

// dataPtr is the address of the first element of a tensor's data (0 when
// empty), to tell whether two tensors share memory.
func dataPtr(t *onnx.Tensor) uintptr {
	v := reflect.ValueOf(t.Data)
	if v.Cap() == 0 {
		return 0
	}
	return uintptr(v.Slice(0, 1).UnsafePointer())
}

// graphModel builds a model of nodes with the given inputs and outputs.
func graphModel(t testing.TB, nodes []*onnxpb.NodeProto, in, out []*onnxpb.ValueInfoProto) []byte {
	t.Helper()
	ir, opset, domain, name := int64(10), int64(21), "", "g"
	m := &onnx.Model{Proto: &onnxpb.ModelProto{
		IrVersion:   &ir,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: &domain, Version: &opset}},
		Graph:       &onnxpb.GraphProto{Name: &name, Node: nodes, Input: in, Output: out},
	}}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func node(op string, in []string, out string) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: &op, Input: in, Output: []string{out}}
}

func floats(name string, dims []int64, v ...float32) *onnx.Tensor {
	return &onnx.Tensor{Name: name, Type: onnx.Float, Dims: dims, Data: v}
}

// TestOutputShapeCache: outputs are pre-allocated once a run has shown
// their shapes for the given input shapes, per combination of input
// shapes (a dynamic batch that changes), and RunReuse writes into the
// memory it is given back, also when a smaller batch follows a larger one.
// The steps share one session and run in order; one that stops (t.Fatal)
// stops the rest, which would build on what it did not do.
func TestOutputShapeCache(t *testing.T) {
	ortest.Init(t)
	c := newCacheRuns(t)
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"first run", c.firstRun},
		{"pre-allocated run", c.preallocatedRun},
		{"reusing run", c.reusingRun},
		{"new batch size", c.newBatchSize},
		{"smaller batch into larger memory", c.smallerBatch},
		{"wrong element type", c.wrongType},
	}
	for _, step := range steps {
		finished := false
		t.Run(step.name, func(t *testing.T) {
			step.run(t)
			finished = true
		})
		if !finished {
			return
		}
	}
}

// cacheRuns is what the steps of TestOutputShapeCache share: a session of
// y = Relu(x) and z = x + x, two outputs of a dynamic batch, one of them an
// output no model shape records (z has no type or shape).
type cacheRuns struct {
	s        *ort.Session
	ctx      context.Context
	in4, in2 map[string]*onnx.Tensor
	want     []ort.OutShape          // known for [4,3] after a run with it
	last     map[string]*onnx.Tensor // the previous step's result
}

func newCacheRuns(t *testing.T) *cacheRuns {
	nodes := []*onnxpb.NodeProto{node("Relu", []string{"x"}, "y"), node("Add", []string{"x", "x"}, "z")}
	s, err := ort.NewSessionFromBytes(graphModel(t, nodes,
		[]*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, dynNx3)},
		[]*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, dynNx3), {Name: ptr("z")}}), ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	batch := func(n int) map[string]*onnx.Tensor {
		v := make([]float32, 3*n)
		for i := range v {
			v[i] = float32(i%5) - 2
		}
		return map[string]*onnx.Tensor{"x": floats("x", []int64{int64(n), 3}, v...)}
	}
	return &cacheRuns{s: s, ctx: context.Background(), in4: batch(4), in2: batch(2),
		want: []ort.OutShape{ort.FixedShape(onnx.Float, 4, 3), ort.FixedShape(onnx.Float, 4, 3)}}
}

// exec runs the session over in: Run, or RunReuse when given old.
func (c *cacheRuns) exec(t *testing.T, in, old map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	var got map[string]*onnx.Tensor
	var err error
	if old == nil {
		got, err = c.s.Run(c.ctx, in, nil)
	} else {
		got, err = c.s.RunReuse(c.ctx, in, nil, old)
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// run is exec checking the result.
func (c *cacheRuns) run(t *testing.T, what string, in, old map[string]*onnx.Tensor) map[string]*onnx.Tensor {
	t.Helper()
	got := c.exec(t, in, old)
	x := in["x"].Data.([]float32)
	y, z := got["y"], got["z"]
	if y == nil || z == nil {
		t.Fatalf("%s: outputs %v, want y and z", what, got)
	}
	for _, o := range []*onnx.Tensor{y, z} {
		if !slices.Equal(o.Dims, in["x"].Dims) || o.Type != onnx.Float || o.Len() != len(x) {
			t.Fatalf("%s: output %s is %s %v with %d elements, want float32 %v", what, o.Name, o.Type, o.Dims, o.Len(), in["x"].Dims)
		}
	}
	for i, v := range x {
		if y.Data.([]float32)[i] != max(v, 0) || z.Data.([]float32)[i] != v+v {
			t.Fatalf("%s: element %d: y = %v, z = %v for x = %v", what, i, y.Data.([]float32)[i], z.Data.([]float32)[i], v)
		}
	}
	return got
}

func (c *cacheRuns) firstRun(t *testing.T) {
	if k := ort.Known(c.s, c.in4); k != nil {
		t.Fatalf("before any run: known = %+v, want nothing", k)
	}
	c.run(t, "first run", c.in4, nil)
	if k := ort.Known(c.s, c.in4); !reflect.DeepEqual(k, c.want) {
		t.Fatalf("after a run with [4,3]: known = %+v, want %+v", k, c.want)
	}
}

func (c *cacheRuns) preallocatedRun(t *testing.T) {
	c.last = c.run(t, "pre-allocated run", c.in4, nil)
}

// reusingRun: the result lives in the memory given back.
func (c *cacheRuns) reusingRun(t *testing.T) {
	y, z := dataPtr(c.last["y"]), dataPtr(c.last["z"])
	third := c.run(t, "reusing run", c.in4, c.last)
	if dataPtr(third["y"]) != y || dataPtr(third["z"]) != z {
		t.Errorf("RunReuse wrote into new memory, want the memory of the tensors given back")
	}
	c.last = third
}

// newBatchSize: a new batch size is a new key; the memory of a batch of 4
// holds a batch of 2 once its shapes are known.
func (c *cacheRuns) newBatchSize(t *testing.T) {
	c.run(t, "first run with [2,3]", c.in2, c.last)
	if k := ort.Known(c.s, c.in2); len(k) != 2 || !slices.Equal(k[0].Dims(), []int64{2, 3}) {
		t.Fatalf("after a run with [2,3]: known = %+v", k)
	}
	if k := ort.Known(c.s, c.in4); !reflect.DeepEqual(k, c.want) {
		t.Errorf("the run with [2,3] changed what is known for [4,3]: %+v", k)
	}
}

func (c *cacheRuns) smallerBatch(t *testing.T) {
	big := c.exec(t, c.in4, nil)
	y := dataPtr(big["y"])
	small := c.run(t, "run with [2,3] into the memory of [4,3]", c.in2, big)
	if dataPtr(small["y"]) != y {
		t.Errorf("a batch of 2 did not reuse the memory of a batch of 4")
	}
	// And back: memory too small for a batch of 4 is not used.
	c.run(t, "run with [4,3] after [2,3]", c.in4, small)
}

// wrongType: given-back tensors of the wrong element type are not used.
func (c *cacheRuns) wrongType(t *testing.T) {
	wrong := map[string]*onnx.Tensor{"y": {Name: "y", Type: onnx.Int32, Dims: []int64{4, 3}, Data: make([]int32, 12)}}
	r, err := c.s.RunReuse(c.ctx, c.in4, []string{"y"}, wrong)
	if err != nil {
		t.Fatal(err)
	}
	if r["y"].Type != onnx.Float || dataPtr(r["y"]) == dataPtr(wrong["y"]) {
		t.Errorf("RunReuse over an int32 tensor returned %s in its memory", r["y"].Type)
	}
}

// TestOutputShapeCacheStale: an output whose shape depends on input values
// (ConstantOfShape of an input) makes a remembered shape wrong. The run still
// returns the right result, and the output is left to ONNX Runtime from then
// on, while the other output stays pre-allocated.
func TestOutputShapeCacheStale(t *testing.T) {
	ortest.Init(t)
	shape1 := onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}}}
	nodes := []*onnxpb.NodeProto{node("ConstantOfShape", []string{"shape"}, "y"), node("Neg", []string{"shape"}, "n")}
	s, err := ort.NewSessionFromBytes(graphModel(t, nodes,
		[]*onnxpb.ValueInfoProto{onnx.TensorType("shape", onnx.Int64, shape1)},
		[]*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, onnx.Shape{Ranked: true, Dims: []onnx.Dim{{}, {}}}), onnx.TensorType("n", onnx.Int64, shape1)}), ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var last map[string]*onnx.Tensor
	for i, dims := range [][]int64{{2, 3}, {2, 3}, {4, 5}, {4, 5}, {1, 1}, {2, 3}} {
		in := map[string]*onnx.Tensor{"shape": {Name: "shape", Type: onnx.Int64, Dims: []int64{2}, Data: slices.Clone(dims)}}
		got, err := s.RunReuse(ctx, in, nil, last)
		if err != nil {
			t.Fatalf("run %d with shape %v: %v", i, dims, err)
		}
		y, n := got["y"], got["n"]
		if !slices.Equal(y.Dims, dims) || y.Len() != int(dims[0]*dims[1]) {
			t.Fatalf("run %d: y has shape %v, want %v", i, y.Dims, dims)
		}
		for _, v := range y.Data.([]float32) {
			if v != 0 {
				t.Fatalf("run %d: y holds %v, want zeros", i, v)
			}
		}
		if nd := n.Data.([]int64); nd[0] != -dims[0] || nd[1] != -dims[1] {
			t.Fatalf("run %d: n = %v, want %v negated", i, nd, dims)
		}
		last = got
	}
	k := ort.Known(s, map[string]*onnx.Tensor{"shape": {Dims: []int64{2}}})
	if len(k) != 2 || k[0].State() != ort.ShapeVaries || k[1].State() != ort.ShapeFixed {
		t.Errorf("known = %+v, want y varying and n fixed", k)
	}
}

// TestRunReuseHalf: a float16 output of dynamic shape is fetched through a
// float32 cast and narrowed into the memory given back.
func TestRunReuseHalf(t *testing.T) {
	ortest.Init(t)
	s, err := ort.NewSessionFromBytes(identityModel(t, "Cast", onnx.Float, onnx.Float16, dynNx3, castTo(onnx.Float16)), ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := map[string]*onnx.Tensor{"x": floats("x", []int64{2, 3}, 1.5, -2, 0, 3.25, 65504, -7)}
	want := f16s(1.5, -2, 0, 3.25, 65504, -7)
	var last map[string]*onnx.Tensor
	for i := range 3 {
		got, err := s.RunReuse(context.Background(), in, nil, last)
		if err != nil {
			t.Fatal(err)
		}
		y := got["y"]
		if y.Type != onnx.Float16 || !slices.Equal(y.Data.([]float16.Float16), want) {
			t.Fatalf("run %d: y = %s %v, want float16 %v", i, y.Type, y.Data, want)
		}
		if i == 2 && dataPtr(y) != dataPtr(last["y"]) {
			t.Errorf("run %d: float16 result not narrowed into the memory given back", i)
		}
		last = got
	}
}

// TestRunReuseAllocates: once the shapes are known, a loop that gives each
// result back allocates a small fraction of the outputs' size per run.
func TestRunReuseAllocates(t *testing.T) {
	ortest.Init(t)
	s, err := ort.NewSessionFromBytes(identityModel(t, "Relu", onnx.Float, onnx.Float, dynNx3), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 1 << 16
	in := map[string]*onnx.Tensor{"x": floats("x", []int64{n, 3}, make([]float32, 3*n)...)}
	ctx := context.Background()
	measure := func(reuse bool) uint64 {
		last, err := s.Run(ctx, in, nil)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 10 {
			if !reuse {
				last = nil
			}
			if last, err = s.RunReuse(ctx, in, nil, last); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 10
	}
	out := uint64(3 * n * unsafe.Sizeof(float32(0)))
	if got := measure(false); got < out {
		t.Errorf("runs without reuse allocated %d bytes per run, want at least the output's %d", got, out)
	}
	if got := measure(true); got > out/100 {
		t.Errorf("runs with reuse allocated %d bytes per run, want under 1%% of the output's %d", got, out)
	}
}

func ptr[T any](v T) *T { return &v }

// TestUntypedScalarOutput: an output the model declares without a type
// that turns out to be a scalar cannot be converted by the binding (and ONNX
// Runtime reports the same empty shape for a scalar as for an unknown rank,
// so the session cannot pre-allocate it). Every run fails with an error; it
// used to panic destroying a nil value the binding left behind. Declaring
// the output's rank makes the model run.
func TestUntypedScalarOutput(t *testing.T) {
	ortest.Init(t)
	name, kd := "keepdims", int64(0)
	reduce := node("ReduceMax", []string{"x"}, "m")
	reduce.Attribute = []*onnxpb.AttributeProto{{Name: &name, Type: onnxpb.AttributeProto_INT.Enum(), I: &kd}}
	shape23 := onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}, {Value: 3, Known: true}}}
	in := map[string]*onnx.Tensor{"x": floats("x", []int64{2, 3}, -1, 2, -3, 4, -5, 6)}
	untyped := "m"
	for _, out := range []*onnxpb.ValueInfoProto{{Name: &untyped}, onnx.TensorType("m", onnx.Float, onnx.Shape{Ranked: true})} {
		model := graphModel(t, []*onnxpb.NodeProto{reduce},
			[]*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, shape23)}, []*onnxpb.ValueInfoProto{out})
		s, err := ort.NewSessionFromBytes(model, ort.SessionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Run(context.Background(), in, nil)
		s.Close()
		if out.Type == nil {
			if err == nil {
				t.Errorf("untyped scalar output: Run gave %v, want an error", res["m"])
			}
			continue
		}
		if err != nil {
			t.Fatalf("scalar output with its rank declared: %v", err)
		}
		if got := res["m"]; len(got.Dims) != 0 || !reflect.DeepEqual(got.Data, []float32{6}) {
			t.Errorf("m = %v %v, want the scalar 6", got.Dims, got.Data)
		}
	}
}

// TestRunReusePassthrough: an output that is a graph input or an
// initializer is handed on by ONNX Runtime, which does not write it into a
// pre-allocated buffer: the session must not pre-allocate it, or every run
// after the first returns the memory it was given back (stale values).
func TestRunReusePassthrough(t *testing.T) {
	ortest.Init(t)
	dyn := onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Param: "N"}, {Value: 3, Known: true}}}
	c3 := onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 3, Known: true}}}
	model := graphModel(t, []*onnxpb.NodeProto{node("Relu", []string{"x"}, "y")},
		[]*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, dyn)},
		[]*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, dyn), onnx.TensorType("y", onnx.Float, dyn), onnx.TensorType("c", onnx.Float, c3)})
	var m onnxpb.ModelProto
	if err := proto.Unmarshal(model, &m); err != nil {
		t.Fatal(err)
	}
	c, err := onnx.Encode(floats("c", []int64{3}, 7, 8, 9), onnx.Raw)
	if err != nil {
		t.Fatal(err)
	}
	m.Graph.Initializer = append(m.Graph.Initializer, c)
	data, err := proto.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ort.NewSessionFromBytes(data, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var last map[string]*onnx.Tensor
	for i := range 4 {
		v := float32(i + 1)
		x := []float32{-v, v, 2 * v, -2 * v, 3 * v, -3 * v}
		out, err := s.RunReuse(context.Background(), map[string]*onnx.Tensor{"x": floats("x", []int64{2, 3}, x...)}, nil, last)
		if err != nil {
			t.Fatal(err)
		}
		if got := out["x"].Data; !reflect.DeepEqual(got, x) {
			t.Errorf("run %d: output x = %v, want the input %v", i, got, x)
		}
		if got, want := out["y"].Data, []float32{0, v, 2 * v, 0, 3 * v, 0}; !reflect.DeepEqual(got, want) {
			t.Errorf("run %d: y = %v, want %v", i, got, want)
		}
		if got, want := out["c"].Data, []float32{7, 8, 9}; !reflect.DeepEqual(got, want) {
			t.Errorf("run %d: c = %v, want %v", i, got, want)
		}
		last = out
	}
}
