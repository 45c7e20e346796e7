package dataset

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"sort"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/x448/float16"
)

// Batched reports whether the model's inputs share dimension 0 as a batch
// dimension: every input is a ranked tensor of rank 1 or more and their
// dimension 0 is either free everywhere or the same fixed value
// everywhere. A fixed dimension 0 beside a free one is no batch dimension
// (Silero VAD's state [2,?,128] beside input [?,?]: the 2 is LSTM layers),
// so such a model is unbatched. An empty signature counts as batched.
func Batched(sig []onnx.ValueInfo) bool {
	fixed, free := int64(-1), false
	for _, v := range sig {
		if !v.Shape.Ranked || len(v.Shape.Dims) == 0 {
			return false
		}
		d := v.Shape.Dims[0]
		switch {
		case !d.Known:
			free = true
		case fixed >= 0 && d.Value != fixed:
			return false
		default:
			fixed = d.Value
		}
	}
	return !(free && fixed >= 0)
}

// sampleShape is the shape a Sample's tensor has for input v: v's shape
// without dimension 0 when the model is batched.
func sampleShape(v onnx.ValueInfo, batched bool) []onnx.Dim {
	if batched && len(v.Shape.Dims) > 0 {
		return v.Shape.Dims[1:]
	}
	return v.Shape.Dims
}

func dimsString(d []onnx.Dim) string {
	return onnx.Shape{Dims: d, Ranked: true}.String()
}

// Check reports whether s fits the model signature: one tensor per input,
// of the input's element type and per-sample shape (see Batched). It names
// the sample, the tensor, and what was expected.
func Check(sig []onnx.ValueInfo, s Sample) error {
	batched := Batched(sig)
	for _, v := range sig {
		t, ok := s.Tensors[v.Name]
		if !ok {
			return sampleErr(s.ID, v.Name, fmt.Errorf("missing (sample has %s)", tensorNames(s.Tensors)))
		}
		if t.Type != v.Type {
			return sampleErr(s.ID, v.Name, fmt.Errorf("element type %s, want %s", t.Type, v.Type))
		}
		if !v.Shape.Ranked {
			continue
		}
		want := sampleShape(v, batched)
		if !fits(t.Dims, want) {
			return sampleErr(s.ID, v.Name, fmt.Errorf("shape %v, want %s", t.Dims, dimsString(want)))
		}
	}
	for name := range s.Tensors {
		if !slices.ContainsFunc(sig, func(v onnx.ValueInfo) bool { return v.Name == name }) && len(sig) > 0 {
			return sampleErr(s.ID, name, fmt.Errorf("not a model input (inputs: %s)", inputNames(sig)))
		}
	}
	return nil
}

func fits(got []int64, want []onnx.Dim) bool {
	if len(got) != len(want) {
		return false
	}
	for i, d := range want {
		if d.Known && d.Value != got[i] {
			return false
		}
	}
	return true
}

func tensorNames(m map[string]*onnx.Tensor) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, fmt.Sprintf("%q", n))
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "no tensors"
	}
	return fmt.Sprint(names)
}

func inputNames(sig []onnx.ValueInfo) string {
	names := make([]string, len(sig))
	for i, v := range sig {
		names[i] = fmt.Sprintf("%q", v.Name)
	}
	return fmt.Sprint(names)
}

// Conform returns s adapted to the signature, then checked with Check: a
// leading dimension of 1 that the model's per-sample shape lacks is
// dropped, and floating-point tensors are converted to the float type the
// input wants (float32 → float16, float64 → float32, ...). Integer and
// other conversions are refused: they would change values silently.
func Conform(sig []onnx.ValueInfo, s Sample) (Sample, error) {
	batched := Batched(sig)
	out := Sample{ID: s.ID, Label: s.Label, Tensors: make(map[string]*onnx.Tensor, len(s.Tensors))}
	for name, t := range s.Tensors {
		out.Tensors[name] = t
	}
	for _, v := range sig {
		t, ok := out.Tensors[v.Name]
		if !ok || !v.Shape.Ranked {
			continue
		}
		want := sampleShape(v, batched)
		if len(t.Dims) == len(want)+1 && t.Dims[0] == 1 {
			c := *t
			c.Dims = t.Dims[1:]
			t = &c
		}
		if t.Type != v.Type && t.Type.IsFloat() && v.Type.IsFloat() {
			c, err := convertFloat(t, v.Type)
			if err != nil {
				return Sample{}, sampleErr(s.ID, v.Name, err)
			}
			t = c
		}
		out.Tensors[v.Name] = t
	}
	return out, Check(sig, out)
}

func convertFloat(t *onnx.Tensor, to onnx.DataType) (*onnx.Tensor, error) {
	f, err := t.Float64s()
	if err != nil {
		return nil, err
	}
	c := &onnx.Tensor{Name: t.Name, Type: to, Dims: t.Dims}
	switch to {
	case onnx.Float:
		c.Data = mapSlice(f, func(v float64) float32 { return float32(v) })
	case onnx.Double:
		c.Data = f
	case onnx.Float16:
		c.Data = mapSlice(f, func(v float64) float16.Float16 { return float16.Fromfloat32(float32(v)) })
	case onnx.BFloat16:
		c.Data = mapSlice(f, func(v float64) onnx.BF16 { return onnx.BF16From(float32(v)) })
	default:
		return nil, fmt.Errorf("cannot convert %s to %s", t.Type, to)
	}
	return c, nil
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// BatchOptions says how Batches groups samples.
type BatchOptions struct {
	// Size is the number of samples per batch (at least 1).
	Size int
	// DropLast drops a last batch with fewer than Size samples instead of
	// yielding it.
	DropLast bool
	// Inputs is the model signature; when set every sample is passed
	// through Conform, and a fixed batch dimension must equal Size.
	Inputs []onnx.ValueInfo
}

// Batch is a group of samples stacked along a new dimension 0.
type Batch struct {
	IDs     []string
	Labels  []int64
	Tensors map[string]*onnx.Tensor
}

// Slice returns samples [i, j) of b, sharing its memory: b itself when that
// is all of it, and nil when a tensor is not stacked along dimension 0.
func (b *Batch) Slice(i, j int) *Batch {
	n := len(b.IDs)
	if i == 0 && j == n {
		return b
	}
	for _, t := range b.Tensors {
		if len(t.Dims) == 0 || t.Dims[0] != int64(n) || t.Len()%n != 0 {
			return nil
		}
	}
	sub := &Batch{IDs: b.IDs[i:j], Tensors: make(map[string]*onnx.Tensor, len(b.Tensors))}
	if len(b.Labels) == n {
		sub.Labels = b.Labels[i:j]
	}
	for name, t := range b.Tensors {
		per := t.Len() / n
		dims := append([]int64{int64(j - i)}, t.Dims[1:]...)
		data := reflect.ValueOf(t.Data).Slice(i*per, j*per).Interface()
		sub.Tensors[name] = &onnx.Tensor{Name: t.Name, Type: t.Type, Dims: dims, Data: data}
	}
	return sub
}

// Batches reads the samples of src in the given order (nil: 0..Len()-1)
// and yields them in batches. Iteration stops after the first error, which
// is yielded with a nil batch. Only one batch is in memory at a time.
func Batches(ctx context.Context, src Source, order []int, opts BatchOptions) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		if err := checkBatchOptions(opts); err != nil {
			yield(nil, err)
			return
		}
		if order == nil {
			order = make([]int, src.Len())
			for i := range order {
				order[i] = i
			}
		}
		batched := Batched(opts.Inputs)
		var pending []Sample
		flush := func() bool {
			b, err := stack(pending, batched)
			pending = pending[:0]
			return yield(b, err) && err == nil
		}
		for _, i := range order {
			if err := ctx.Err(); err != nil {
				yield(nil, err)
				return
			}
			s, err := src.Sample(ctx, i)
			if err == nil && opts.Inputs != nil {
				s, err = Conform(opts.Inputs, s)
			}
			if err != nil {
				yield(nil, err)
				return
			}
			pending = append(pending, s)
			if len(pending) == opts.Size && !flush() {
				return
			}
		}
		if len(pending) > 0 && !opts.DropLast {
			flush()
		}
	}
}

func checkBatchOptions(opts BatchOptions) error {
	if opts.Size < 1 {
		return fmt.Errorf("batch size %d: must be at least 1", opts.Size)
	}
	if !Batched(opts.Inputs) {
		if opts.Size != 1 {
			return fmt.Errorf("batch size %d: the model's inputs have no common batch dimension, so batches hold 1 sample", opts.Size)
		}
		return nil
	}
	for _, v := range opts.Inputs {
		if d := v.Shape.Dims[0]; d.Known && d.Value != int64(opts.Size) {
			return fmt.Errorf("batch size %d: model input %q has a fixed batch dimension of %d", opts.Size, v.Name, d.Value)
		}
	}
	return nil
}

// stack builds one batch. Unbatched models get the single sample's tensors as they are.
func stack(samples []Sample, batched bool) (*Batch, error) {
	b := &Batch{Tensors: map[string]*onnx.Tensor{}}
	for _, s := range samples {
		b.IDs = append(b.IDs, s.ID)
		b.Labels = append(b.Labels, s.Label)
	}
	first := samples[0]
	if !batched {
		b.Tensors = first.Tensors
		return b, nil
	}
	for name, t0 := range first.Tensors {
		n := t0.Len()
		data := reflect.MakeSlice(reflect.TypeOf(t0.Data), 0, n*len(samples))
		for _, s := range samples {
			t, ok := s.Tensors[name]
			switch {
			case !ok:
				return nil, sampleErr(s.ID, name, fmt.Errorf("missing (sample %s has it)", first.ID))
			case t.Type != t0.Type || !slices.Equal(t.Dims, t0.Dims):
				return nil, sampleErr(s.ID, name, fmt.Errorf("%s%v cannot be batched with %s%v of sample %s", t.Type, t.Dims, t0.Type, t0.Dims, first.ID))
			case reflect.TypeOf(t.Data) != data.Type() || t.Len() != n:
				return nil, sampleErr(s.ID, name, errors.New("tensor data does not match its type and shape"))
			}
			data = reflect.AppendSlice(data, reflect.ValueOf(t.Data))
		}
		for _, s := range samples {
			if len(s.Tensors) != len(first.Tensors) {
				return nil, sampleErr(s.ID, "", fmt.Errorf("has tensors %s, sample %s has %s", tensorNames(s.Tensors), first.ID, tensorNames(first.Tensors)))
			}
		}
		dims := append([]int64{int64(len(samples))}, t0.Dims...)
		b.Tensors[name] = &onnx.Tensor{Name: name, Type: t0.Type, Dims: dims, Data: data.Interface()}
	}
	return b, nil
}

// rowOf copies row i (along dimension 0) of t.
func rowOf(t *onnx.Tensor, i int) *onnx.Tensor {
	n := 1
	for _, d := range t.Dims[1:] {
		n *= int(d)
	}
	src := reflect.ValueOf(t.Data).Slice(i*n, (i+1)*n)
	dst := reflect.MakeSlice(src.Type(), n, n)
	reflect.Copy(dst, src)
	return &onnx.Tensor{Name: t.Name, Type: t.Type, Dims: slices.Clone(t.Dims[1:]), Data: dst.Interface()}
}

// splitRows decides how many samples a file given alone holds: the rows
// along dimension 0, unless the signature shows the tensors are one sample
// (rank one less than the model input's) or the model is unbatched.
func splitRows(sig []onnx.ValueInfo, ts map[string]*onnx.Tensor) (rows int, split bool, err error) {
	if len(sig) > 0 && !Batched(sig) {
		return 1, false, nil
	}
	rows, first := -1, ""
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t := ts[name]
		tsplit := len(t.Dims) > 0
		if i := slices.IndexFunc(sig, func(v onnx.ValueInfo) bool { return v.Name == name }); i >= 0 && sig[i].Shape.Ranked {
			tsplit = len(t.Dims) == len(sig[i].Shape.Dims)
		}
		r := 1
		if tsplit {
			r = int(t.Dims[0])
		}
		if rows >= 0 && (r != rows || tsplit != split) {
			return 0, false, fmt.Errorf("tensors %q and %q hold different numbers of samples (%d and %d)", first, name, rows, r)
		}
		rows, split, first = r, tsplit, name
	}
	if rows < 0 {
		return 0, false, errors.New("no tensors")
	}
	return rows, split, nil
}

// splitSamples cuts tensors into samples as splitRows decides.
func splitSamples(sig []onnx.ValueInfo, id string, ts map[string]*onnx.Tensor) ([]Sample, error) {
	rows, split, err := splitRows(sig, ts)
	if err != nil {
		return nil, sampleErr(id, "", err)
	}
	if !split {
		return []Sample{{ID: id, Tensors: ts, Label: -1}}, nil
	}
	out := make([]Sample, rows)
	for r := range out {
		out[r] = Sample{ID: fmt.Sprintf("%s#%d", id, r), Tensors: map[string]*onnx.Tensor{}, Label: -1}
		for name, t := range ts {
			out[r].Tensors[name] = rowOf(t, r)
		}
	}
	return out, nil
}
