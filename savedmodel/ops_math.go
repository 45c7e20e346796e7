package savedmodel

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/onnx"
)

var mathOps = map[string]opFunc{
	"Relu6": relu6, "LeakyRelu": leakyRelu, "Softmax": softmax("Softmax"), "LogSoftmax": softmax("LogSoftmax"),
	"Rsqrt": rsqrt, "Square": square, "SquaredDifference": squaredDifference, "DivNoNan": divNoNan,
	"Cast": cast, "MatMul": matMul, "BatchMatMul": batchMatMul, "BatchMatMulV2": batchMatMul,
	"BatchMatMulV3": batchMatMul, "Einsum": einsum,
	"Mean": reduce("ReduceMean"), "Sum": reduce("ReduceSum"), "Max": reduce("ReduceMax"),
	"Min": reduce("ReduceMin"), "Prod": reduce("ReduceProd"),
	"ArgMax": argMinMax("ArgMax"), "ArgMin": argMinMax("ArgMin"), "Select": selectOp, "SelectV2": selectOp,
	"Where": where, "TopKV2": topK, "Range": rangeOp, "FloorDiv": floorDiv,
}

func relu6(c *opCtx) error {
	dt, err := c.dtype("T")
	if err != nil {
		return err
	}
	lo, err := c.e.scalar(c.n.name+"/zero", dt, 0)
	if err != nil {
		return err
	}
	hi, err := c.e.scalar(c.n.name+"/six", dt, 6)
	if err != nil {
		return err
	}
	x, err := c.input(0)
	if err != nil {
		return err
	}
	c.emit("Clip", []string{x, lo, hi})
	return nil
}

func leakyRelu(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	alpha := float32(0.2)
	if a, ok := c.n.attr["alpha"]; ok {
		alpha = a.GetF()
	}
	c.emit("LeakyRelu", []string{x}, attrFloat("alpha", alpha))
	return nil
}

func softmax(op string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		c.emit(op, []string{x}, attrInt("axis", -1))
		return nil
	}
}

func rsqrt(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	c.emit("Reciprocal", []string{c.tmp("Sqrt", []string{x})})
	return nil
}

func square(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	c.emit("Mul", []string{x, x})
	return nil
}

func squaredDifference(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	d := c.tmp("Sub", c.in)
	c.emit("Mul", []string{d, d})
	return nil
}

// divNoNan is x/y with 0 wherever y is 0.
func divNoNan(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	dt, err := c.dtype("T")
	if err != nil {
		return err
	}
	zero, err := c.e.scalar(c.n.name+"/zero", dt, 0)
	if err != nil {
		return err
	}
	one, err := c.e.scalar(c.n.name+"/one", dt, 1)
	if err != nil {
		return err
	}
	isZero := c.tmp("Equal", []string{c.in[1], zero})
	safe := c.tmp("Where", []string{isZero, one, c.in[1]})
	q := c.tmp("Div", []string{c.in[0], safe})
	c.emit("Where", []string{isZero, zero, q})
	return nil
}

func cast(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	dt, err := c.dtype("DstT")
	if err != nil {
		return err
	}
	c.emit("Cast", []string{x}, attrInt("to", int64(dt)))
	return nil
}

func matMul(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	a, b := c.in[0], c.in[1]
	if c.boolAttr("transpose_a") {
		a = c.tmp("Transpose", []string{a}, attrInts("perm", 1, 0))
	}
	if c.boolAttr("transpose_b") {
		b = c.transposeInput(1, []int64{1, 0})
	}
	c.emit("MatMul", []string{a, b})
	return nil
}

// transposeInput transposes input i, folding it when it is a constant.
func (c *opCtx) transposeInput(i int, perm []int64) string {
	if t, ok := c.constant(i); ok && len(t.Dims) == len(perm) {
		if tt, err := transposeTensor(t, perm); err == nil {
			name, err := c.e.constant(c.e.fresh(c.in[i]+"/T"), tt)
			if err == nil {
				return name
			}
		}
	}
	return c.tmp("Transpose", []string{c.in[i]}, attrInts("perm", perm...))
}

// batchMatMul is MatMul with adj_x/adj_y as an Einsum over the last two axes.
func batchMatMul(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	adjX, adjY := c.boolAttr("adj_x"), c.boolAttr("adj_y")
	if !adjX && !adjY {
		c.emit("MatMul", c.in)
		return nil
	}
	a, b := "...ij", "...jk"
	if adjX {
		a = "...ji"
	}
	if adjY {
		b = "...kj"
	}
	c.emit("Einsum", c.in, attrString("equation", a+","+b+"->...ik"))
	return nil
}

func einsum(c *opCtx) error {
	eq := c.strAttr("equation")
	if eq == "" {
		return fmt.Errorf("no equation")
	}
	c.emit("Einsum", c.in, attrString("equation", eq))
	return nil
}

// reduce maps Mean/Sum/Max/Min/Prod; opset 17 takes ReduceSum's axes as an
// input and the others' as an attribute.
func reduce(op string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		keep := int64(0)
		if c.boolAttr("keep_dims") {
			keep = 1
		}
		if op == "ReduceSum" {
			axes, err := c.int64Input(1)
			if err != nil {
				return err
			}
			axes = c.tmp("Reshape", []string{axes, c.e.ints(c.n.name+"/flat", -1)})
			c.emit(op, []string{x, axes}, attrInt("keepdims", keep))
			return nil
		}
		axes, err := c.constInts(1)
		if err != nil {
			return err
		}
		c.emit(op, []string{x}, attrInts("axes", axes...), attrInt("keepdims", keep))
		return nil
	}
}

func argMinMax(op string) opFunc {
	return func(c *opCtx) error {
		x, err := c.input(0)
		if err != nil {
			return err
		}
		axis, err := c.constInts(1)
		if err != nil || len(axis) != 1 {
			return fmt.Errorf("axis must be a constant scalar")
		}
		idx := c.tmp(op, []string{x}, attrInt("axis", axis[0]), attrInt("keepdims", 0))
		dt, err := c.dtype("output_type")
		if err != nil {
			dt = onnx.Int64
		}
		c.emit("Cast", []string{idx}, attrInt("to", int64(dt)))
		return nil
	}
}

func selectOp(c *opCtx) error {
	if len(c.in) != 3 {
		return fmt.Errorf("has %d inputs, want 3", len(c.in))
	}
	c.emit("Where", c.in)
	return nil
}

// where with one input lists the coordinates of the true elements.
func where(c *opCtx) error {
	if len(c.in) == 3 {
		return selectOp(c)
	}
	x, err := c.input(0)
	if err != nil {
		return err
	}
	nz := c.tmp("NonZero", []string{x})
	c.emit("Transpose", []string{nz}, attrInts("perm", 1, 0))
	return nil
}

func topK(c *opCtx) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	k, err := c.int64Input(1)
	if err != nil {
		return err
	}
	k = c.tmp("Reshape", []string{k, c.e.ints(c.n.name+"/one", 1)})
	idx := c.e.fresh(c.n.name + "/indices")
	sorted := int64(1)
	if a, ok := c.n.attr["sorted"]; ok && !a.GetB() {
		sorted = 0
	}
	c.e.node("TopK", []string{x, k}, []string{c.out(0), idx}, attrInt("axis", -1), attrInt("sorted", sorted))
	c.e.node("Cast", []string{idx}, []string{c.out(1)}, attrInt("to", int64(onnx.Int32)))
	return nil
}

func rangeOp(c *opCtx) error {
	if len(c.in) != 3 {
		return fmt.Errorf("has %d inputs, want 3", len(c.in))
	}
	c.emit("Range", c.in)
	return nil
}

// floorDiv is Floor(x / y) for floating-point types.
func floorDiv(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	dt, err := c.dtype("T")
	if err != nil {
		return err
	}
	if !slices.Contains([]onnx.DataType{onnx.Float, onnx.Double, onnx.Float16}, dt) {
		return fmt.Errorf("FloorDiv of %s is not mapped (only floating point)", dt)
	}
	c.emit("Floor", []string{c.tmp("Div", c.in)})
	return nil
}
