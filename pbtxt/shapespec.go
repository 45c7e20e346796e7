package pbtxt

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ShapeSpec is a trtexec shapes spec, the value of --minShapes, --optShapes,
// --maxShapes or --shapes: input names with their full dims (batch
// dimension included), in the order given.
type ShapeSpec []TensorShape

// TensorShape is one entry of a ShapeSpec. Dims is empty for a scalar (0-D)
// shape. Name may hold one '*', which trtexec matches against any run of
// characters.
type TensorShape struct {
	Name string
	Dims []int64
}

// ParseShapeSpec reads a shapes spec the way trtexec does (TensorRT 8.x to
// 10.x, `trtexec --help` and reference/formats.md §7.3): entries separated
// by ',', each "name:dims" with dims separated by 'x' ("input0:1x3x224x224").
// A name holding ':' is wrapped in single quotes ("'input:0':1x3x224x224");
// an unquoted name is everything before the last ':'. "name:scalar" and
// "name:" are 0-D shapes. kiln is stricter than trtexec where trtexec would
// guess: names must be unique, non-empty and hold at most one '*', a quoted
// name must open the entry, and dims are decimal sizes. The empty spec has
// no entries.
func ParseShapeSpec(s string) (ShapeSpec, error) {
	if s == "" {
		return nil, nil
	}
	var spec ShapeSpec
	seen := map[string]bool{}
	for i, entry := range strings.Split(s, ",") {
		ts, err := parseShapeEntry(entry)
		if err != nil {
			return nil, fmt.Errorf("shapes entry %d %q: %w", i, entry, err)
		}
		if seen[ts.Name] {
			return nil, fmt.Errorf("shapes entry %d %q: input %q is already given", i, entry, ts.Name)
		}
		seen[ts.Name] = true
		spec = append(spec, ts)
	}
	return spec, nil
}

func parseShapeEntry(entry string) (TensorShape, error) {
	var name, val string
	if strings.Contains(entry, "'") {
		rest, ok := strings.CutPrefix(entry, "'")
		if !ok {
			return TensorShape{}, errors.New("a quoted name must start the entry, as in 'input:0':1x3")
		}
		n, after, ok := strings.Cut(rest, "'")
		if !ok {
			return TensorShape{}, errors.New("the quoted name has no closing quote")
		}
		if strings.Contains(after, "'") {
			return TensorShape{}, errors.New("too many quotes: only the name is quoted")
		}
		if val, ok = strings.CutPrefix(after, ":"); !ok {
			return TensorShape{}, errors.New("want ':' after the quoted name")
		}
		name = n
	} else {
		i := strings.LastIndexByte(entry, ':')
		if i < 0 {
			return TensorShape{}, errors.New("want name:dims, as in input0:1x3x224x224")
		}
		name, val = entry[:i], entry[i+1:]
	}
	switch {
	case name == "":
		return TensorShape{}, errors.New("the input name is empty")
	case strings.Count(name, "*") > 1:
		return TensorShape{}, errors.New("an input name holds at most one '*' wildcard")
	}
	dims, err := parseShapeDims(val)
	if err != nil {
		return TensorShape{}, err
	}
	return TensorShape{Name: name, Dims: dims}, nil
}

// parseShapeDims reads "1x3x224x224"; "" and "scalar" are the 0-D shape.
func parseShapeDims(val string) ([]int64, error) {
	if val == "" || val == "scalar" {
		return nil, nil
	}
	parts := strings.Split(val, "x")
	dims := make([]int64, 0, len(parts))
	for _, p := range parts {
		if p == "" || len(p) > 18 || strings.Trim(p, "0123456789") != "" {
			return nil, fmt.Errorf("dimension %q is not a size; want dims like 1x3x224x224", p)
		}
		d, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("dimension %q: %w", p, err)
		}
		dims = append(dims, d)
	}
	return dims, nil
}

// String writes the spec in the form ParseShapeSpec reads: names holding
// ':' quoted, scalars as "name:scalar".
func (s ShapeSpec) String() string {
	parts := make([]string, len(s))
	for i, ts := range s {
		name := ts.Name
		if strings.Contains(name, ":") {
			name = "'" + name + "'"
		}
		dims := "scalar"
		if len(ts.Dims) > 0 {
			ds := make([]string, len(ts.Dims))
			for j, d := range ts.Dims {
				ds[j] = strconv.FormatInt(d, 10)
			}
			dims = strings.Join(ds, "x")
		}
		parts[i] = name + ":" + dims
	}
	return strings.Join(parts, ",")
}

// lookup returns the entry for input name: the one that names it exactly,
// else the first whose wildcard matches it.
func (s ShapeSpec) lookup(name string) (TensorShape, bool) {
	for _, ts := range s {
		if ts.Name == name {
			return ts, true
		}
	}
	for _, ts := range s {
		if pre, suf, ok := strings.Cut(ts.Name, "*"); ok && len(name) >= len(pre)+len(suf) && strings.HasPrefix(name, pre) && strings.HasSuffix(name, suf) {
			return ts, true
		}
	}
	return TensorShape{}, false
}

// exact returns the entry named name.
func (s ShapeSpec) exact(name string) (TensorShape, bool) {
	for _, ts := range s {
		if ts.Name == name {
			return ts, true
		}
	}
	return TensorShape{}, false
}
