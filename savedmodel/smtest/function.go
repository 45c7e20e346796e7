package smtest

import (
	"strconv"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// Param is one argument or result of a library function.
type Param struct {
	Name  string
	DType smpb.DataType
}

// Function builds a FunctionDef of the graph's function library, as TF2
// writes the cond and body of a While or a tf.function a call node runs.
// Its nodes name inputs as TF does inside functions: an argument by name,
// a node output as "node:out_arg:index".
type Function struct{ Def *smpb.FunctionDef }

// Function adds an empty function taking in and returning out.
func (g *Graph) Function(name string, in, out []Param) *Function {
	sig := &smpb.OpDef{Name: name}
	for _, p := range in {
		sig.InputArg = append(sig.InputArg, &smpb.OpDef_ArgDef{Name: p.Name, Type: p.DType})
	}
	for _, p := range out {
		sig.OutputArg = append(sig.OutputArg, &smpb.OpDef_ArgDef{Name: p.Name, Type: p.DType})
	}
	f := &Function{Def: &smpb.FunctionDef{Signature: sig, Ret: map[string]string{}}}
	g.Functions = append(g.Functions, f.Def)
	return f
}

// Node adds a node to the function and returns its name.
func (f *Function) Node(name, op string, attr Attrs, in ...string) string {
	f.Def.NodeDef = append(f.Def.NodeDef, &smpb.NodeDef{Name: name, Op: op, Input: in, Attr: attr})
	return name
}

// Out is the reference to output index of node's output argument arg.
func Out(node, arg string, index int) string {
	return node + ":" + arg + ":" + strconv.Itoa(index)
}

// Return binds result name to ref (an argument or Out(...)).
func (f *Function) Return(name, ref string) { f.Def.Ret[name] = ref }

// Func is a function-valued AttrValue (While's cond and body).
func Func(name string) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_Func{Func: &smpb.NameAttrList{Name: name}}}
}

// Types is a list-of-types AttrValue (While's T).
func Types(t ...smpb.DataType) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{Type: t}}}
}

// Shapes is an _output_shapes AttrValue; a nil entry is an unknown rank.
func Shapes(dims ...[]int64) *smpb.AttrValue {
	l := &smpb.AttrValue_ListValue{}
	for _, d := range dims {
		s := &smpb.TensorShapeProto{UnknownRank: true}
		if d != nil {
			s = ShapeProto(d)
		}
		l.Shape = append(l.Shape, s)
	}
	return &smpb.AttrValue{Value: &smpb.AttrValue_List{List: l}}
}
