package dataset

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// pbSet is one sample's files: input_N.pb by N, or a single .pb file.
type pbSet struct {
	files []string
	nums  []int
}

// openPB indexes TensorProto files. A single file is one set; in a
// directory every folder holding input_N.pb files (an onnx backend test's
// test_data_set_M) is a set, whose input N binds to the N-th model input.
func openPB(ctx context.Context, spec Spec, fsys FS, names []string, single bool) (Source, error) {
	sets := map[string]*pbSet{}
	var order []string
	for _, n := range names {
		dir, num := n, 0
		if !single {
			// Not path.Dir, which would fold "gs://" into "gs:/".
			if i := strings.LastIndex(n, "/"); i >= 0 {
				dir = n[:i]
			} else {
				dir = "."
			}
			m := pbInputRE.FindStringSubmatch(path.Base(n))
			num, _ = strconv.Atoi(m[1])
		}
		s := sets[dir]
		if s == nil {
			s = &pbSet{}
			sets[dir] = s
			order = append(order, dir)
		}
		s.files = append(s.files, n)
		s.nums = append(s.nums, num)
	}
	sort.Strings(order)
	u := &unitSource{fsys: fsys}
	u.load = func(ctx context.Context, fsys FS, unit string) ([]Sample, error) {
		ts, err := loadPBSet(ctx, fsys, spec.Inputs, sets[unit])
		if err != nil {
			return nil, sampleErr(unit, "", err)
		}
		return splitSamples(spec.Inputs, unit, ts)
	}
	for _, dir := range order {
		rows, err := u.load(ctx, fsys, dir)
		if err != nil {
			return nil, err
		}
		u.add(dir, len(rows))
	}
	return u, nil
}

func loadPBSet(ctx context.Context, fsys FS, sig []onnx.ValueInfo, set *pbSet) (map[string]*onnx.Tensor, error) {
	ts := map[string]*onnx.Tensor{}
	for k, file := range set.files {
		num := set.nums[k]
		b, err := readAll(ctx, fsys, file)
		if err != nil {
			return nil, err
		}
		var p onnxpb.TensorProto
		if err := proto.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("%s: not a TensorProto: %w", path.Base(file), err)
		}
		t, err := onnx.Decode(&p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path.Base(file), err)
		}
		switch {
		case num < len(sig):
			t.Name = sig[num].Name
		case len(sig) > 0:
			return nil, fmt.Errorf("%s: the model has only %d inputs", path.Base(file), len(sig))
		case t.Name == "":
			t.Name = fmt.Sprintf("input_%d", num)
		}
		if _, dup := ts[t.Name]; dup {
			return nil, fmt.Errorf("%s: tensor %q appears twice", path.Base(file), t.Name)
		}
		ts[t.Name] = t
	}
	return ts, nil
}
