package onnx

import (
	"fmt"
	"sort"
	"strings"
)

// Summary is what `kiln inspect` reports about a model.
type Summary struct {
	Path            string        `json:"path,omitempty"`
	IRVersion       int64         `json:"ir_version"`
	Opsets          []OpsetInfo   `json:"opsets"`
	Producer        string        `json:"producer,omitempty"`
	ProducerVersion string        `json:"producer_version,omitempty"`
	Domain          string        `json:"domain,omitempty"`
	ModelVersion    int64         `json:"model_version,omitempty"`
	GraphName       string        `json:"graph_name,omitempty"`
	Inputs          []TensorInfo  `json:"inputs"`
	Outputs         []TensorInfo  `json:"outputs"`
	Params          ParamTotals   `json:"parameters"`
	Nodes           int           `json:"nodes"`
	OpCounts        []OpCount     `json:"op_counts"`
	Precision       PrecisionInfo `json:"precision"`
	Batch           BatchVerdict  `json:"batch"`
	Metadata        []KeyValue    `json:"metadata,omitempty"`
	Warnings        []string      `json:"warnings,omitempty"`
}

// OpsetInfo is one operator set import.
type OpsetInfo struct {
	Domain  string `json:"domain"`
	Version int64  `json:"version"`
}

// TensorInfo describes a graph input or output.
type TensorInfo struct {
	Name  string   `json:"name"`
	Kind  string   `json:"kind"`
	Type  string   `json:"type,omitempty"`
	Shape []string `json:"shape"`
	Rank  int      `json:"rank"`
}

// ParamTotals counts weights in total and per element type.
type ParamTotals struct {
	Count  int64         `json:"count"`
	Bytes  int64         `json:"bytes"`
	ByType []ParamByType `json:"by_type"`
}

// ParamByType is the share of one element type.
type ParamByType struct {
	Type  string `json:"type"`
	Count int64  `json:"count"`
	Bytes int64  `json:"bytes"`
}

// OpCount is how many nodes have one op type.
type OpCount struct {
	Op    string `json:"op"`
	Count int    `json:"count"`
}

// KeyValue is one metadata_props entry.
type KeyValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// PrecisionInfo says what numeric form the model is already in.
type PrecisionInfo struct {
	// Kind is "fp32", "fp16", "bf16", "mixed", "int8-qdq" (explicit Q/DQ),
	// "int8-qoperator" (QLinear* operators) or "other".
	Kind       string `json:"kind"`
	FP16       bool   `json:"fp16"`
	QDQ        bool   `json:"qdq"`
	QOperator  bool   `json:"qoperator"`
	QDQPairs   int    `json:"qdq_nodes,omitempty"`
	FloatTypes string `json:"float_types"`
}

// BatchVerdict says whether Triton can batch the model (Triton's ONNX
// Runtime autofill rule: every input and output has rank >= 1 and a
// dynamic first dimension).
type BatchVerdict struct {
	Batchable bool   `json:"batchable"`
	Reason    string `json:"reason"`
	// FixedBatch is the common fixed first dimension when every tensor has one (often 1).
	FixedBatch int64 `json:"fixed_batch,omitempty"`
}

// Summarize inspects a loaded model.
func Summarize(m *Model) Summary {
	p := m.Proto
	s := Summary{
		Path:            m.Path,
		IRVersion:       p.GetIrVersion(),
		Producer:        p.GetProducerName(),
		ProducerVersion: p.GetProducerVersion(),
		Domain:          p.GetDomain(),
		ModelVersion:    p.GetModelVersion(),
		GraphName:       m.Graph().GetName(),
	}
	for _, o := range p.GetOpsetImport() {
		d := o.GetDomain()
		if d == "" {
			d = "ai.onnx"
		}
		s.Opsets = append(s.Opsets, OpsetInfo{Domain: d, Version: o.GetVersion()})
	}
	sort.Slice(s.Opsets, func(i, j int) bool { return s.Opsets[i].Domain < s.Opsets[j].Domain })
	ins, outs := m.Inputs(), m.Outputs()
	for _, v := range ins {
		s.Inputs = append(s.Inputs, tensorInfo(v))
	}
	for _, v := range outs {
		s.Outputs = append(s.Outputs, tensorInfo(v))
	}
	for _, ps := range m.Params() {
		s.Params.Count += ps.Count
		s.Params.Bytes += ps.Bytes
		s.Params.ByType = append(s.Params.ByType, ParamByType{Type: ps.Type.String(), Count: ps.Count, Bytes: ps.Bytes})
	}
	counts := m.OpCounts()
	for op, n := range counts {
		s.Nodes += n
		s.OpCounts = append(s.OpCounts, OpCount{Op: op, Count: n})
	}
	sort.Slice(s.OpCounts, func(i, j int) bool {
		if s.OpCounts[i].Count != s.OpCounts[j].Count {
			return s.OpCounts[i].Count > s.OpCounts[j].Count
		}
		return s.OpCounts[i].Op < s.OpCounts[j].Op
	})
	for _, kv := range p.GetMetadataProps() {
		s.Metadata = append(s.Metadata, KeyValue{Key: kv.GetKey(), Value: kv.GetValue()})
	}
	s.Precision = precisionOf(m, counts, ins, outs)
	s.Batch = BatchOf(ins, outs)
	if len(ins) == 0 {
		s.Warnings = append(s.Warnings, "the graph has no inputs that are not initializers")
	}
	if len(outs) == 0 {
		s.Warnings = append(s.Warnings, "the graph has no outputs")
	}
	if m.HasExternalData() {
		s.Warnings = append(s.Warnings, "some tensors are stored in external data files that were not loaded")
	}
	if _, err := TopoSort(m.Graph()); err != nil {
		s.Warnings = append(s.Warnings, err.Error())
	}
	if u := UnknownFields(m.Proto); len(u) > 0 {
		s.Warnings = append(s.Warnings, fmt.Sprintf("fields unknown to kiln's ONNX schema were kept: %s", strings.Join(limit(u, 5), ", ")))
	}
	return s
}

func limit(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("(%d more)", len(s)-n))
	}
	return s
}

func tensorInfo(v ValueInfo) TensorInfo {
	t := TensorInfo{Name: v.Name, Kind: v.Kind, Shape: []string{}}
	if v.Kind == "tensor" || v.Kind == "sparse_tensor" {
		t.Type = v.Type.String()
	}
	if v.Shape.Ranked {
		t.Rank = len(v.Shape.Dims)
		for _, d := range v.Shape.Dims {
			t.Shape = append(t.Shape, d.String())
		}
	} else {
		t.Rank = -1
	}
	return t
}

// BatchOf applies Triton's batching rule to a model's inputs and outputs.
func BatchOf(ins, outs []ValueInfo) BatchVerdict {
	all := append(append([]ValueInfo{}, ins...), outs...)
	if len(all) == 0 {
		return BatchVerdict{Reason: "the model has no inputs or outputs"}
	}
	var fixed int64 = -1
	allFixedSame := true
	for _, v := range all {
		if v.Kind != "tensor" {
			return BatchVerdict{Reason: fmt.Sprintf("%s is a %s, not a tensor", v.Name, v.Kind)}
		}
		if !v.Shape.Ranked {
			return BatchVerdict{Reason: fmt.Sprintf("%s has no known rank", v.Name)}
		}
		if len(v.Shape.Dims) == 0 {
			return BatchVerdict{Reason: fmt.Sprintf("%s is a scalar, so there is no batch dimension", v.Name)}
		}
		d := v.Shape.Dims[0]
		if d.Known {
			if fixed == -1 {
				fixed = d.Value
			} else if fixed != d.Value {
				allFixedSame = false
			}
		} else {
			allFixedSame = false
		}
	}
	for _, v := range all {
		if d := v.Shape.Dims[0]; d.Known {
			verdict := BatchVerdict{Reason: fmt.Sprintf("%s has a fixed first dimension %d; Triton can serve the model only with max_batch_size 0 (re-export it with a dynamic batch axis to batch)", v.Name, d.Value)}
			if allFixedSame {
				verdict.FixedBatch = fixed
			}
			return verdict
		}
	}
	return BatchVerdict{Batchable: true, Reason: "every input and output has a dynamic first dimension"}
}

func precisionOf(m *Model, counts map[string]int, ins, outs []ValueInfo) PrecisionInfo {
	var pi PrecisionInfo
	floats := map[DataType]int64{}
	for _, ps := range m.Params() {
		if ps.Type.IsFloat() {
			floats[ps.Type] += ps.Count
		}
	}
	for _, v := range append(append([]ValueInfo{}, ins...), outs...) {
		if v.Type.IsFloat() {
			floats[v.Type]++
		}
	}
	var names []string
	for t := range floats {
		names = append(names, t.String())
	}
	sort.Strings(names)
	pi.FloatTypes = strings.Join(names, ",")
	pi.QDQPairs = counts["QuantizeLinear"] + counts["DequantizeLinear"]
	pi.QDQ = pi.QDQPairs > 0 && counts["DequantizeLinear"] > 0
	for op := range counts {
		if strings.HasPrefix(op, "QLinear") || strings.HasPrefix(op, "com.microsoft::QLinear") || op == "ConvInteger" || op == "MatMulInteger" {
			pi.QOperator = true
		}
	}
	f16, f32, bf16 := floats[Float16] > 0, floats[Float] > 0, floats[BFloat16] > 0
	pi.FP16 = f16 && floats[Float16] >= floats[Float]
	switch {
	case pi.QDQ:
		pi.Kind = "int8-qdq"
	case pi.QOperator:
		pi.Kind = "int8-qoperator"
	case f16 && !f32:
		pi.Kind = "fp16"
	case bf16 && !f32 && !f16:
		pi.Kind = "bf16"
	case f16 || bf16:
		pi.Kind = "mixed"
	case f32:
		pi.Kind = "fp32"
	default:
		pi.Kind = "other"
	}
	return pi
}
