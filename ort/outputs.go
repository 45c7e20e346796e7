package ort

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"

	"github.com/kiln-ml/kiln/onnx"
	ortgo "github.com/yalue/onnxruntime_go"
)

// Outputs that ONNX Runtime allocates cost a copy: the binding copies each
// into a fresh Go slice (so that the value outlives ONNX Runtime's buffer),
// which also means fresh memory, page faults and garbage on every run. When
// the session knows an output's element type and shape before the run, it
// hands ONNX Runtime a tensor over Go memory instead, which the kernel that
// computes the output writes into and the result then aliases.
//
// What the session knows comes from earlier runs: for each combination of
// input shapes it remembers the type and shape of every output. Output
// shapes usually follow from input shapes alone; an output whose shape also
// depends on input values (NonZero, a Reshape to a computed shape) makes
// ONNX Runtime refuse the pre-allocated buffer. Run then forgets what it
// knew for those input shapes, runs again with ONNX Runtime allocating,
// and from then on leaves the outputs whose shape changed to ONNX Runtime.

// maxShapeKeys bounds the input-shape combinations a session remembers;
// past it the cache starts over (a loop over varied shapes then pays the
// copy, as without the cache).
const maxShapeKeys = 32

// outShape is what a session knows about one fetched output for one
// combination of input shapes.
type outShape struct {
	state shapeState
	typ   onnx.DataType // of the fetched value (float32 for a widened output)
	dims  []int64
}

type shapeState uint8

const (
	shapeUnknown shapeState = iota // not seen yet
	shapeFixed                     // seen, always with typ and dims
	shapeVaries                    // seen with different shapes, or not a numeric tensor
)

// shapeCache maps input shapes to the shapes of the fetched outputs. Entries
// are replaced, never changed in place, so a reader may keep one.
type shapeCache struct {
	mu      sync.Mutex
	entries map[string][]outShape
}

func (c *shapeCache) get(key string) []outShape {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[key]
}

func (c *shapeCache) put(key string, e []outShape) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= maxShapeKeys {
		c.entries = map[string][]outShape{}
	}
	c.entries[key] = e
}

func (c *shapeCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// shapeKey identifies the shapes of inputs, in the session's input order.
func (s *Session) shapeKey(inputs map[string]*onnx.Tensor) string {
	var buf [128]byte
	b := buf[:0]
	for _, in := range s.inputs {
		for _, d := range inputs[in.Name].Dims {
			b = strconv.AppendInt(b, d, 10)
			b = append(b, ',')
		}
		b = append(b, ';')
	}
	return string(b)
}

// merge combines what was known with what a run observed.
func merge(known, seen []outShape) ([]outShape, bool) {
	if known == nil {
		return seen, true
	}
	changed := false
	out := slices.Clone(known)
	for i, o := range seen {
		k := known[i]
		switch {
		case k.state == shapeVaries || o.state == shapeUnknown:
		case o.state == shapeVaries || k.state == shapeFixed && (k.typ != o.typ || !slices.Equal(k.dims, o.dims)):
			out[i], changed = outShape{state: shapeVaries}, true
		case k.state == shapeUnknown:
			out[i], changed = o, true
		}
	}
	return out, changed
}

// preallocatable reports whether outputs of dt can be handed to ONNX
// Runtime as Go memory.
func preallocatable(dt onnx.DataType) bool {
	return dt != onnx.String && dt != onnx.Undefined && supported(dt)
}

// run runs the session once with the outputs pre-allocated that the shape
// cache knows, and once more without them if ONNX Runtime refused them.
func (s *Session) run(ctx context.Context, inputs map[string]*onnx.Tensor, want map[string]bool, old map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	key := s.shapeKey(inputs)
	known := s.shapes.get(key)
	plan := known
	if plan == nil {
		plan = s.guessPlan(inputs)
	}
	res, seen, used, err := s.runOnce(ctx, inputs, want, old, plan)
	if err != nil && used && ctx.Err() == nil {
		// A remembered shape was wrong (or the run fails anyway, which
		// the second run tells).
		s.shapes.forget(key)
		res, seen, _, err = s.runOnce(ctx, inputs, want, old, nil)
	}
	if err != nil {
		return nil, err
	}
	if e, changed := merge(known, seen); changed {
		s.shapes.put(key, e)
	}
	return res, nil
}

// runOnce runs the session. plan (nil: nothing known) says which outputs to
// pre-allocate; seen reports what the run showed of each output's shape, and
// used whether anything was pre-allocated from plan.
func (s *Session) runOnce(ctx context.Context, inputs map[string]*onnx.Tensor, want map[string]bool, old map[string]*onnx.Tensor, plan []outShape) (res map[string]*onnx.Tensor, seen []outShape, used bool, err error) {
	in := make([]ortgo.Value, len(s.inputs))
	out := make([]ortgo.Value, len(s.fetches))
	defer func() {
		// The binding leaves the values it allocated in out, even when it
		// fails half-way through converting them; there it can also leave
		// typed nil pointers.
		for _, v := range append(in, out...) {
			if v != nil && !reflect.ValueOf(v).IsNil() {
				v.Destroy()
			}
		}
	}()
	for i, info := range s.inputs {
		v, err := toValue(inputs[info.Name])
		if err != nil {
			return nil, nil, false, fmt.Errorf("input %q: %w", info.Name, err)
		}
		in[i] = v
	}
	seen = make([]outShape, len(s.fetches))
	data := make([]any, len(s.fetches)) // Go slices behind pre-allocated outputs; nil for scalars
	for i, f := range s.fetches {
		info := s.outputs[f.out]
		var err error
		switch {
		case f.widened && info.Ranked && len(info.Dims) == 0:
			out[i], _, err = allocate(onnx.Float, nil, nil)
			seen[i] = outShape{state: shapeFixed, typ: onnx.Float, dims: []int64{}}
		case info.Kind != "tensor" && info.Kind != "" || info.Type == onnx.String:
			seen[i] = outShape{state: shapeVaries}
		case !f.widened && info.static() && (len(info.Dims) == 0 || info.Type == onnx.Float16 || info.Type == onnx.BFloat16):
			// The binding can neither convert rank-0 outputs nor float16
			// and bfloat16 outputs that ONNX Runtime allocates.
			out[i], data[i], err = allocate(info.Type, info.Dims, reusable(old, info.Name, info.Type))
			seen[i] = outShape{state: shapeFixed, typ: info.Type, dims: info.Dims}
		case plan != nil && plan[i].state == shapeFixed:
			// Outputs with a recorded static shape are left to ONNX
			// Runtime too until a run shows the shape, so that a model
			// whose recorded shape is stale still runs.
			p := plan[i]
			out[i], data[i], err = allocate(p.typ, p.dims, reusable(old, info.Name, p.typ))
			seen[i], used = p, true
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("output %q: %w", info.Name, err)
		}
	}
	if err := s.runORT(ctx, in, out); err != nil {
		return nil, nil, used, err
	}
	for i, f := range s.fetches {
		if f.input && data[i] != nil {
			if x := inputs[s.outputs[f.out].Name]; x != nil {
				dst, src := reflect.ValueOf(data[i]), reflect.ValueOf(x.Data)
				if dst.Type() == src.Type() && dst.Len() == src.Len() {
					reflect.Copy(dst, src)
				}
			}
		}
	}
	res = make(map[string]*onnx.Tensor, len(want))
	for i, f := range s.fetches {
		info := s.outputs[f.out]
		if out[i] == nil {
			return nil, nil, used, fmt.Errorf("output %q: ONNX Runtime returned no value", info.Name)
		}
		if seen[i].state == shapeUnknown {
			seen[i] = observe(out[i])
		}
		if !want[info.Name] {
			continue
		}
		var t *onnx.Tensor
		if data[i] != nil {
			t = &onnx.Tensor{Name: info.Name, Type: seen[i].typ, Dims: slices.Clone(seen[i].dims), Data: data[i]}
		} else if t, err = fromValue(info.Name, out[i]); err != nil {
			return nil, nil, used, fmt.Errorf("output %q: %w", info.Name, err)
		}
		if f.widened {
			if t, err = narrow(t, info.Type, reusable(old, info.Name, info.Type)); err != nil {
				return nil, nil, used, fmt.Errorf("output %q: %w", info.Name, err)
			}
		}
		res[info.Name] = t
	}
	return res, seen, used, nil
}

// reusable returns the data of old's tensor name when it holds elements of
// type dt (allocate and narrow check the capacity), or nil.
func reusable(old map[string]*onnx.Tensor, name string, dt onnx.DataType) any {
	if t := old[name]; t != nil && t.Type == dt {
		return t.Data
	}
	return nil
}

// observe records the type and shape of an output ONNX Runtime allocated.
func observe(v ortgo.Value) outShape {
	if v.GetONNXType() != ortgo.ONNXTypeTensor {
		return outShape{state: shapeVaries}
	}
	dt := onnx.DataType(int(v.DataType()))
	dims := []int64(v.GetShape())
	if !preallocatable(dt) || len(dims) == 0 && (dt == onnx.Float16 || dt == onnx.BFloat16 || isFloat8(dt)) {
		// The binding has no scalars of the custom-data types.
		return outShape{state: shapeVaries}
	}
	return outShape{state: shapeFixed, typ: dt, dims: slices.Clone(dims)}
}

// RunReuse is Run for loops: it may write the outputs into the memory of
// old, tensors the caller has finished with (typically the previous result
// of this session), so that runs over inputs of the same shapes allocate no
// output memory once the session has seen those shapes. A tensor of old is
// reused for the output of the same name when its element type matches and
// its data has room for the output (a smaller last batch fits into the
// memory of a full one).
//
// Ownership: old passes to the session. After the call the caller must not
// read or write any tensor of old (its memory may back the result, or be
// dropped), and old must not share memory with inputs or with anything else
// the caller still uses. The result is owned by the caller as with Run. old
// may be nil.
func (s *Session) RunReuse(ctx context.Context, inputs map[string]*onnx.Tensor, outputs []string, old map[string]*onnx.Tensor) (map[string]*onnx.Tensor, error) {
	return s.runChecked(ctx, inputs, outputs, old)
}
