package check

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ParseBinding parses NAME=VALUE, the form of --input and --shape: the
// input name is everything before the last '=' (names may hold ':' and
// '/', as TensorFlow's "input_1:0" does).
func ParseBinding(s string) (name, value string, err error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 || i == len(s)-1 {
		return "", "", fmt.Errorf("%q is not NAME=VALUE", s)
	}
	return s[:i], s[i+1:], nil
}

// ParseDims parses a shape written as trtexec and Polygraphy write it,
// 1x3x640x640 (or 1,3,640,640); "" or "scalar" is a scalar (no dimension).
// A -1 is a dynamic dimension (an imported SavedModel's input keeps it
// dynamic; random data takes the model's size there).
func ParseDims(s string) ([]int64, error) {
	if s == "" || s == "scalar" {
		return []int64{}, nil
	}
	sep := "x"
	if strings.Contains(s, ",") {
		sep = ","
	}
	parts := strings.Split(s, sep)
	dims := make([]int64, len(parts))
	for i, p := range parts {
		d, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil || d < -1 {
			return nil, fmt.Errorf("shape %q: dimension %d (%q) is not a non-negative integer or -1 (dynamic)", s, i, p)
		}
		if d > 1<<31 {
			return nil, fmt.Errorf("shape %q: dimension %d is too large", s, i)
		}
		dims[i] = d
	}
	return dims, nil
}

// FormatDims writes dims as ParseDims reads them.
func FormatDims(dims []int64) string {
	if len(dims) == 0 {
		return "scalar"
	}
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, "x")
}

// ParseShapes parses --shape values into a map, refusing an input given twice.
func ParseShapes(values []string) (map[string][]int64, error) {
	out := map[string][]int64{}
	for _, v := range values {
		name, val, err := ParseBinding(v)
		if err != nil {
			return nil, fmt.Errorf("--shape: %w", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--shape: input %q is given twice", name)
		}
		d, err := ParseDims(val)
		if err != nil {
			return nil, fmt.Errorf("--shape %s: %w", name, err)
		}
		out[name] = d
	}
	return out, nil
}

// ParseInputs parses --input values (NAME=FILE.npy, NAME=FILE.pb, NAME=NUMBER).
func ParseInputs(values []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		name, val, err := ParseBinding(v)
		if err != nil {
			return nil, fmt.Errorf("--input: %w", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--input: input %q is given twice", name)
		}
		out[name] = val
	}
	if len(out) == 0 && len(values) > 0 {
		return nil, errors.New("--input: nothing given")
	}
	return out, nil
}
