package savedmodel

import (
	"fmt"
	"reflect"

	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

var nnOps = map[string]opFunc{
	"Conv2D": conv2D, "DepthwiseConv2dNative": conv2D, "BiasAdd": biasAdd, "BiasAddV1": biasAdd,
	"FusedBatchNorm": batchNorm, "FusedBatchNormV2": batchNorm, "FusedBatchNormV3": batchNorm,
	"MaxPool": pool("MaxPool"), "AvgPool": pool("AveragePool"),
}

var (
	nhwcToNCHW = []int64{0, 3, 1, 2}
	nchwToNHWC = []int64{0, 2, 3, 1}
)

func (c *opCtx) nhwc() bool {
	f := c.strAttr("data_format")
	return f == "" || f == "NHWC"
}

// spatial picks the H and W entries of a 4-entry TF attribute.
func (c *opCtx) spatial(name string, def int64) []int64 {
	v := c.intsAttr(name)
	if len(v) != 4 {
		return []int64{def, def}
	}
	if c.nhwc() {
		return []int64{v[1], v[2]}
	}
	return []int64{v[2], v[3]}
}

// padding turns TF's padding attribute into ONNX attributes.
func (c *opCtx) padding() ([]*onnxpb.AttributeProto, error) {
	switch p := c.strAttr("padding"); p {
	case "SAME":
		return []*onnxpb.AttributeProto{attrString("auto_pad", "SAME_UPPER")}, nil
	case "VALID":
		return []*onnxpb.AttributeProto{attrString("auto_pad", "VALID")}, nil
	case "EXPLICIT":
		e := c.intsAttr("explicit_paddings")
		if len(e) != 8 {
			return nil, fmt.Errorf("explicit_paddings has %d values, want 8", len(e))
		}
		h, w := 1, 2
		if !c.nhwc() {
			h, w = 2, 3
		}
		return []*onnxpb.AttributeProto{attrInts("pads", e[2*h], e[2*w], e[2*h+1], e[2*w+1])}, nil
	default:
		return nil, fmt.Errorf("padding %q is not supported", p)
	}
}

// nchw runs body on input 0 in NCHW layout, wrapping it in Transposes when
// the node is NHWC; the optimizer cancels them between layers.
func (c *opCtx) nchw(body func(x string) string) error {
	x, err := c.input(0)
	if err != nil {
		return err
	}
	if !c.nhwc() {
		c.emit("Identity", []string{body(x)})
		return nil
	}
	y := body(c.tmp("Transpose", []string{x}, attrInts("perm", nhwcToNCHW...)))
	c.emit("Transpose", []string{y}, attrInts("perm", nchwToNHWC...))
	return nil
}

func conv2D(c *opCtx) error {
	pads, err := c.padding()
	if err != nil {
		return err
	}
	attrs := append(pads, attrInts("strides", c.spatial("strides", 1)...), attrInts("dilations", c.spatial("dilations", 1)...))
	w := ""
	if c.n.op == "DepthwiseConv2dNative" {
		k, ok := c.constant(1)
		if !ok || len(k.Dims) != 4 {
			return fmt.Errorf("the depthwise filter must be a constant of rank 4")
		}
		r := *k
		r.Dims = []int64{k.Dims[0], k.Dims[1], 1, k.Dims[2] * k.Dims[3]}
		t, err := transposeTensor(&r, []int64{3, 2, 0, 1})
		if err != nil {
			return err
		}
		if w, err = c.e.constant(c.e.fresh(c.in[1]+"/OIHW"), t); err != nil {
			return err
		}
		attrs = append(attrs, attrInt("group", k.Dims[2]))
	} else {
		if len(c.in) != 2 {
			return fmt.Errorf("has %d inputs, want 2", len(c.in))
		}
		w = c.transposeInput(1, []int64{3, 2, 0, 1})
	}
	return c.nchw(func(x string) string { return c.tmp("Conv", []string{x, w}, attrs...) })
}

func biasAdd(c *opCtx) error {
	if len(c.in) != 2 {
		return fmt.Errorf("has %d inputs, want 2", len(c.in))
	}
	if c.nhwc() {
		c.emit("Add", c.in)
		return nil
	}
	b := c.tmp("Reshape", []string{c.in[1], c.e.ints(c.n.name+"/shape", -1, 1, 1)})
	c.emit("Add", []string{c.in[0], b})
	return nil
}

func batchNorm(c *opCtx) error {
	if len(c.in) != 5 {
		return fmt.Errorf("has %d inputs, want 5", len(c.in))
	}
	if a, ok := c.n.attr["is_training"]; ok && a.GetB() {
		if m, ok := c.constant(3); !ok || m.Len() == 0 {
			return fmt.Errorf("is_training batch norm has no moving statistics to freeze")
		}
	}
	eps := float32(1e-4)
	if a, ok := c.n.attr["epsilon"]; ok {
		eps = a.GetF()
	}
	p := c.in[1:5]
	return c.nchw(func(x string) string {
		return c.tmp("BatchNormalization", append([]string{x}, p...), attrFloat("epsilon", eps))
	})
}

func pool(op string) opFunc {
	return func(c *opCtx) error {
		pads, err := c.padding()
		if err != nil {
			return err
		}
		attrs := append(pads, attrInts("kernel_shape", c.spatial("ksize", 1)...), attrInts("strides", c.spatial("strides", 1)...))
		return c.nchw(func(x string) string { return c.tmp(op, []string{x}, attrs...) })
	}
}

// transposeTensor permutes a constant's axes.
func transposeTensor(t *onnx.Tensor, perm []int64) (*onnx.Tensor, error) {
	if len(perm) != len(t.Dims) {
		return nil, fmt.Errorf("transposing %v by %v", t.Dims, perm)
	}
	src := reflect.ValueOf(t.Data)
	if src.Kind() != reflect.Slice || src.Len() != t.Len() {
		return nil, fmt.Errorf("transposing a %T constant", t.Data)
	}
	rank := len(perm)
	dims := make([]int64, rank)
	for i, p := range perm {
		dims[i] = t.Dims[p]
	}
	stride := make([]int64, rank)
	s := int64(1)
	for i := rank - 1; i >= 0; i-- {
		stride[i] = s
		s *= t.Dims[i]
	}
	dst := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
	idx := make([]int64, rank)
	for o := 0; o < src.Len(); o++ {
		off := int64(0)
		for i := range rank {
			off += idx[i] * stride[perm[i]]
		}
		dst.Index(o).Set(src.Index(int(off)))
		for i := rank - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < dims[i] {
				break
			}
			idx[i] = 0
		}
	}
	return &onnx.Tensor{Name: t.Name, Type: t.Type, Dims: dims, Data: dst.Interface()}, nil
}
