package savedmodel

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

var xlaOps = map[string]opFunc{"XlaDotV2": xlaDot, "XlaDot": xlaDot}

// dotDims is xla.DotDimensionNumbers (xla_data.proto): fields 1-4 are the
// lhs and rhs contracting and batch dimensions.
type dotDims struct {
	lhsContract, rhsContract, lhsBatch, rhsBatch []int64
}

// parseDotDims decodes a serialized DotDimensionNumbers, packed or not;
// unknown fields are skipped as proto3 readers do.
func parseDotDims(b []byte) (dotDims, error) {
	var d dotDims
	fields := map[protowire.Number]*[]int64{1: &d.lhsContract, 2: &d.rhsContract, 3: &d.lhsBatch, 4: &d.rhsBatch}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return d, fmt.Errorf("dimension_numbers: %w", protowire.ParseError(n))
		}
		b = b[n:]
		dst := fields[num]
		switch {
		case dst != nil && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return d, fmt.Errorf("dimension_numbers field %d: %w", num, protowire.ParseError(n))
			}
			*dst = append(*dst, int64(v))
			b = b[n:]
		case dst != nil && typ == protowire.BytesType:
			p, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return d, fmt.Errorf("dimension_numbers field %d: %w", num, protowire.ParseError(n))
			}
			for len(p) > 0 {
				v, m := protowire.ConsumeVarint(p)
				if m < 0 {
					return d, fmt.Errorf("dimension_numbers field %d: %w", num, protowire.ParseError(m))
				}
				*dst = append(*dst, int64(v))
				p = p[m:]
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return d, fmt.Errorf("dimension_numbers field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if len(d.lhsContract) != len(d.rhsContract) || len(d.lhsBatch) != len(d.rhsBatch) {
		return d, fmt.Errorf("dimension_numbers pair %d lhs with %d rhs contracting and %d lhs with %d rhs batch dimensions",
			len(d.lhsContract), len(d.rhsContract), len(d.lhsBatch), len(d.rhsBatch))
	}
	return d, nil
}

// equation is the Einsum equation of the dot for operands of rank r1 and
// r2: batch dims, then lhs free dims, then rhs free dims, as XLA orders
// the result.
func (d dotDims) equation(r1, r2 int) (string, error) {
	if r1+r2 > 52 {
		return "", fmt.Errorf("ranks %d and %d need more than 52 einsum letters", r1, r2)
	}
	lhs, rhs := make([]byte, r1), make([]byte, r2)
	next := byte(0)
	letter := func() byte {
		next++
		return "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[next-1]
	}
	var out []byte
	pair := func(a, b []int64, kind string, keep bool) error {
		for k := range a {
			if a[k] < 0 || a[k] >= int64(r1) || b[k] < 0 || b[k] >= int64(r2) || lhs[a[k]] != 0 || rhs[b[k]] != 0 {
				return fmt.Errorf("%s dimensions %v and %v do not fit ranks %d and %d once each", kind, a, b, r1, r2)
			}
			l := letter()
			lhs[a[k]], rhs[b[k]] = l, l
			if keep {
				out = append(out, l)
			}
		}
		return nil
	}
	if err := pair(d.lhsBatch, d.rhsBatch, "batch", true); err != nil {
		return "", err
	}
	if err := pair(d.lhsContract, d.rhsContract, "contracting", false); err != nil {
		return "", err
	}
	for _, side := range [][]byte{lhs, rhs} {
		for i := range side {
			if side[i] == 0 {
				side[i] = letter()
				out = append(out, side[i])
			}
		}
	}
	return string(lhs) + "," + string(rhs) + "->" + string(out), nil
}

// isMatMul reports whether the dot is ONNX MatMul as it stands: batch dims
// leading in both, lhs contracting its last, rhs its first non-batch dim.
func (d dotDims) isMatMul(r1, r2 int) bool {
	nb := len(d.lhsBatch)
	if len(d.lhsContract) != 1 || d.lhsContract[0] != int64(r1-1) || d.rhsContract[0] != int64(nb) || r2 != nb+2 {
		return false
	}
	for k := range nb {
		if d.lhsBatch[k] != int64(k) || d.rhsBatch[k] != int64(k) {
			return false
		}
	}
	return nb == 0 || r1 == nb+2
}

// ranks finds the operand ranks from their shapes, or one of them from
// the other and the output's recorded rank.
func (c *opCtx) dotRanks(d dotDims) (int, int, error) {
	a, okA := c.dims(0)
	b, okB := c.dims(1)
	o, okO := c.outDims(0)
	fixed := 2 * (len(d.lhsContract) + len(d.lhsBatch))
	switch {
	case okA && okB:
		return len(a), len(b), nil
	case okA && okO:
		return len(a), len(o) + fixed - len(a) - len(d.lhsBatch), nil
	case okB && okO:
		return len(o) + fixed - len(b) - len(d.lhsBatch), len(b), nil
	}
	return 0, 0, fmt.Errorf("the operand ranks are unknown (no constant or _output_shapes)")
}

// xlaDot maps XlaDot/XlaDotV2 (jax2tf's dot_general) to MatMul when the
// dimensions already line up and to Einsum otherwise. precision_config
// only asks XLA for at least some precision; ONNX computes at the full
// precision of the type.
func xlaDot(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	d, err := parseDotDims(c.attr("dimension_numbers").GetS())
	if err != nil {
		return err
	}
	r1, r2, err := c.dotRanks(d)
	if err != nil {
		return err
	}
	ins := slices.Clone(c.in)
	if out, err := c.dtype("preferred_element_type"); err == nil {
		for i, t := range []string{"LhsT", "RhsT"} {
			if in, err := c.dtype(t); err == nil && in != out {
				ins[i] = c.tmp("Cast", []string{ins[i]}, attrInt("to", int64(out)))
			}
		}
	}
	if d.isMatMul(r1, r2) {
		c.emit("MatMul", ins)
		return nil
	}
	eq, err := d.equation(r1, r2)
	if err != nil {
		return err
	}
	c.emit("Einsum", ins, attrString("equation", eq))
	return nil
}
