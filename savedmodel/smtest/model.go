package smtest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/savedmodel/smpb"
)

// Graph builds a TF1-style GraphDef node by node.
type Graph struct {
	Nodes []*smpb.NodeDef
	// Vars are the checkpoint values of the variables the graph declares.
	Vars []Tensor
	// Functions are the graph's function library.
	Functions []*smpb.FunctionDef
}

// Attrs is a NodeDef's attribute map.
type Attrs = map[string]*smpb.AttrValue

// Node adds a node and returns its name.
func (g *Graph) Node(name, op string, attr Attrs, in ...string) string {
	g.Nodes = append(g.Nodes, &smpb.NodeDef{Name: name, Op: op, Input: in, Attr: attr})
	return name
}

// Placeholder adds a Placeholder of dtype and shape (nil dims: unknown rank).
func (g *Graph) Placeholder(name string, dt smpb.DataType, dims []int64) string {
	shape := &smpb.TensorShapeProto{UnknownRank: true}
	if dims != nil {
		shape = ShapeProto(dims)
	}
	return g.Node(name, "Placeholder", Attrs{"dtype": Type(dt), "shape": {Value: &smpb.AttrValue_Shape{Shape: shape}}})
}

// Const adds a Const holding p.
func (g *Graph) Const(name string, p *smpb.TensorProto) string {
	return g.Node(name, "Const", Attrs{"dtype": Type(p.GetDtype()), "value": {Value: &smpb.AttrValue_Tensor{Tensor: p}}})
}

// Floats adds a DT_FLOAT Const of dims (one value broadcasts).
func (g *Graph) Floats(name string, dims []int64, v ...float32) string {
	return g.Const(name, &smpb.TensorProto{Dtype: smpb.DataType_DT_FLOAT, TensorShape: ShapeProto(dims), FloatVal: v})
}

// Ints adds a DT_INT32 vector Const.
func (g *Graph) Ints(name string, v ...int32) string {
	return g.Const(name, &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32, TensorShape: ShapeProto([]int64{int64(len(v))}), IntVal: v})
}

// Int adds a DT_INT32 scalar Const.
func (g *Graph) Int(name string, v int32) string {
	return g.Const(name, &smpb.TensorProto{Dtype: smpb.DataType_DT_INT32, TensorShape: ShapeProto(nil), IntVal: []int32{v}})
}

// Variable declares a TF1 reference variable (VariableV2, read through
// NAME/read) whose checkpoint key is its name, and returns the read.
func (g *Graph) Variable(name string, dims []int64, v []float32) string {
	g.Node(name, "VariableV2", Attrs{"dtype": Type(smpb.DataType_DT_FLOAT), "shape": Shape(dims)})
	g.Vars = append(g.Vars, Tensor{Key: name, DType: smpb.DataType_DT_FLOAT, Dims: dims, Data: v})
	return g.Node(name+"/read", "Identity", Attrs{"T": Type(smpb.DataType_DT_FLOAT)}, name)
}

// ResourceVariable declares a resource variable (VarHandleOp with
// shared_name, read by ReadVariableOp) and returns the read.
func (g *Graph) ResourceVariable(name string, dims []int64, v []float32) string {
	g.Node(name, "VarHandleOp", Attrs{"dtype": Type(smpb.DataType_DT_FLOAT), "shape": Shape(dims), "shared_name": Str(name)})
	g.Vars = append(g.Vars, Tensor{Key: name, DType: smpb.DataType_DT_FLOAT, Dims: dims, Data: v})
	return g.Node(name+"/Read/ReadVariableOp", "ReadVariableOp", Attrs{"dtype": Type(smpb.DataType_DT_FLOAT)}, name)
}

// Type, Str, Int64, Bool, Float, List and Shape are AttrValues.
func Type(t smpb.DataType) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_Type{Type: t}}
}
func Str(s string) *smpb.AttrValue    { return &smpb.AttrValue{Value: &smpb.AttrValue_S{S: []byte(s)}} }
func Int64(v int64) *smpb.AttrValue   { return &smpb.AttrValue{Value: &smpb.AttrValue_I{I: v}} }
func Bool(v bool) *smpb.AttrValue     { return &smpb.AttrValue{Value: &smpb.AttrValue_B{B: v}} }
func Float(v float32) *smpb.AttrValue { return &smpb.AttrValue{Value: &smpb.AttrValue_F{F: v}} }
func List(v ...int64) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_List{List: &smpb.AttrValue_ListValue{I: v}}}
}
func Shape(dims []int64) *smpb.AttrValue {
	return &smpb.AttrValue{Value: &smpb.AttrValue_Shape{Shape: ShapeProto(dims)}}
}

// Arg is one signature argument: the graph tensor ("x:0") it binds, its
// dtype and shape (nil dims: unknown rank).
type Arg struct {
	Tensor string
	DType  smpb.DataType
	Dims   []int64
}

func (a Arg) info() *smpb.TensorInfo {
	s := &smpb.TensorShapeProto{UnknownRank: true}
	if a.Dims != nil {
		s = ShapeProto(a.Dims)
	}
	return &smpb.TensorInfo{Encoding: &smpb.TensorInfo_Name{Name: a.Tensor}, Dtype: a.DType, TensorShape: s}
}

// Signature is a SignatureDef's arguments.
type Signature struct{ Inputs, Outputs map[string]Arg }

// SavedModel wraps g as a SavedModel with one "serve" meta graph and the
// given signatures (keyed "serving_default" and so on).
func (g *Graph) SavedModel(sigs map[string]Signature) *smpb.SavedModel {
	mg := &smpb.MetaGraphDef{
		MetaInfoDef:  &smpb.MetaInfoDef{Tags: []string{"serve"}, TensorflowVersion: "2.15.0"},
		GraphDef:     &smpb.GraphDef{Node: g.Nodes, Versions: &smpb.VersionDef{Producer: 1645}},
		SignatureDef: map[string]*smpb.SignatureDef{},
	}
	if len(g.Functions) > 0 {
		mg.GraphDef.Library = &smpb.FunctionDefLibrary{Function: g.Functions}
	}
	for k, s := range sigs {
		sd := &smpb.SignatureDef{MethodName: "tensorflow/serving/predict",
			Inputs: map[string]*smpb.TensorInfo{}, Outputs: map[string]*smpb.TensorInfo{}}
		for n, a := range s.Inputs {
			sd.Inputs[n] = a.info()
		}
		for n, a := range s.Outputs {
			sd.Outputs[n] = a.info()
		}
		mg.SignatureDef[k] = sd
	}
	return &smpb.SavedModel{SavedModelSchemaVersion: 1, MetaGraphs: []*smpb.MetaGraphDef{mg}}
}

// Write writes g as the SavedModel dir: dir/saved_model.pb and the
// variables bundle dir/variables/variables.{index,data-00000-of-00001}
// (written also when g has no variables, as TensorFlow does), with one
// serving_default signature.
func (g *Graph) Write(dir string, sig Signature) error {
	return WriteModel(dir, g.SavedModel(map[string]Signature{"serving_default": sig}), 1, g.Vars)
}

// WriteModel writes sm and a bundle of shards data files holding vars.
func WriteModel(dir string, sm *smpb.SavedModel, shards int32, vars []Tensor) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "saved_model.pb"), marshal(sm), 0o644); err != nil {
		return err
	}
	if err := WriteBundle(filepath.Join(dir, "variables", "variables"), shards, vars); err != nil {
		return fmt.Errorf("writing variables of %s: %w", dir, err)
	}
	return nil
}
