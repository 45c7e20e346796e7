package onnx

import (
	"errors"
	"fmt"
	"io"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Large models are almost entirely initializer raw_data. protobuf-go copies
// every bytes field on unmarshal and builds one buffer on marshal, which
// doubles time and memory for a 100 MB model. The two functions below move
// big raw_data blocks around the protobuf library instead: on load they are
// cut out of the wire bytes, the (small) rest is unmarshalled normally and
// the blocks are attached as sub-slices of the file buffer; on save the
// small parts are marshalled and the blocks are streamed to the file.
//
// Field numbers used: ModelProto.graph = 7, GraphProto.initializer = 5,
// TensorProto.raw_data = 9.

// maxProto is the largest message protobuf readers (ONNX Runtime, the onnx
// package, TensorRT's parser) accept: 2 GiB - 1. A var so tests can lower it.
var maxProto int64 = 1<<31 - 1

// ErrTooLarge is returned by Save for a model whose weights do not fit in
// one protobuf message; such models need external data files, which Save
// does not write yet.
var ErrTooLarge = errors.New("model is larger than the 2 GiB protobuf limit and would need external data files, which kiln does not write yet")

var bigRaw = 64 << 10 // raw_data blocks at least this large are handled outside protobuf (a var so tests can lower it)

// unmarshalModel decodes data into a ModelProto. Big raw_data fields alias
// data, which the caller must not modify afterwards.
func unmarshalModel(data []byte) (*onnxpb.ModelProto, error) {
	rest, blocks, ok := cutRawData(data)
	mp := &onnxpb.ModelProto{}
	if !ok {
		return mp, proto.Unmarshal(data, mp)
	}
	if err := proto.Unmarshal(rest, mp); err != nil {
		return nil, err
	}
	inits := mp.GetGraph().GetInitializer()
	for i, b := range blocks {
		if i >= len(inits) {
			return nil, errors.New("initializer count changed while decoding")
		}
		if b != nil {
			inits[i].RawData = b
		}
	}
	return mp, nil
}

// cutRawData returns the model bytes with big initializer raw_data removed
// and the removed blocks per initializer index. ok is false when the input
// has a shape the fast path does not handle (then the caller decodes it the
// ordinary way, which also reports any error).
func cutRawData(data []byte) (rest []byte, blocks [][]byte, ok bool) {
	var graph []byte
	graphStart, graphEnd := -1, -1
	for off := 0; off < len(data); {
		num, typ, n := protowire.ConsumeTag(data[off:])
		if n < 0 {
			return nil, nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, data[off+n:])
		if m < 0 {
			return nil, nil, false
		}
		if num == 7 {
			if typ != protowire.BytesType || graphStart >= 0 {
				return nil, nil, false // a repeated graph field merges; leave it to protobuf
			}
			v, _ := protowire.ConsumeBytes(data[off+n:])
			graph, graphStart, graphEnd = v, off, off+n+m
		}
		off += n + m
	}
	if graphStart < 0 {
		return nil, nil, false
	}
	newGraph := make([]byte, 0, 1024)
	found := false
	for off := 0; off < len(graph); {
		num, typ, n := protowire.ConsumeTag(graph[off:])
		if n < 0 {
			return nil, nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, graph[off+n:])
		if m < 0 {
			return nil, nil, false
		}
		field := graph[off : off+n+m]
		if num == 5 && typ == protowire.BytesType {
			t, _ := protowire.ConsumeBytes(graph[off+n:])
			small, raw, tok := cutTensorRaw(t)
			if !tok {
				return nil, nil, false
			}
			blocks = append(blocks, raw)
			if raw != nil {
				found = true
				newGraph = protowire.AppendTag(newGraph, 5, protowire.BytesType)
				newGraph = protowire.AppendBytes(newGraph, small)
				off += n + m
				continue
			}
		}
		newGraph = append(newGraph, field...)
		off += n + m
	}
	if !found {
		return nil, nil, false
	}
	rest = make([]byte, 0, graphStart+len(newGraph)+len(data)-graphEnd+16)
	rest = append(rest, data[:graphStart]...)
	rest = protowire.AppendTag(rest, 7, protowire.BytesType)
	rest = protowire.AppendBytes(rest, newGraph)
	rest = append(rest, data[graphEnd:]...)
	return rest, blocks, true
}

// cutTensorRaw removes a big raw_data field from one TensorProto encoding.
func cutTensorRaw(t []byte) (small, raw []byte, ok bool) {
	rawStart, rawEnd := -1, -1
	for off := 0; off < len(t); {
		num, typ, n := protowire.ConsumeTag(t[off:])
		if n < 0 {
			return nil, nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, t[off+n:])
		if m < 0 {
			return nil, nil, false
		}
		if num == 9 {
			if typ != protowire.BytesType || rawStart >= 0 {
				return nil, nil, false
			}
			raw, _ = protowire.ConsumeBytes(t[off+n:])
			rawStart, rawEnd = off, off+n+m
		}
		off += n + m
	}
	if rawStart < 0 || len(raw) < bigRaw {
		return t, nil, true
	}
	small = make([]byte, 0, len(t)-(rawEnd-rawStart))
	small = append(small, t[:rawStart]...)
	small = append(small, t[rawEnd:]...)
	return small, raw, true
}

// writeModel streams the model's encoding to w without building it in
// memory: the parts without big raw_data are marshalled, then the blocks are
// written from the tensors themselves. The encoding is deterministic and
// parses to the same message as proto.Marshal's output.
func writeModel(w io.Writer, mp *onnxpb.ModelProto) error {
	g := mp.Graph
	if !hasBigRaw(g) {
		b, err := marshalDet(mp)
		if err != nil {
			return err
		}
		if int64(len(b)) > maxProto {
			return fmt.Errorf("%w: the model would be %d bytes", ErrTooLarge, len(b))
		}
		_, err = w.Write(b)
		return err
	}
	opts := proto.MarshalOptions{Deterministic: true}
	// Model without graph.
	mp.Graph = nil
	head, err := opts.Marshal(mp)
	mp.Graph = g
	if err != nil {
		return err
	}
	// Graph without initializers.
	inits := g.Initializer
	g.Initializer = nil
	gbody, err := opts.Marshal(g)
	g.Initializer = inits
	if err != nil {
		return err
	}
	// Each initializer without its big raw_data.
	type part struct {
		small []byte
		raw   []byte
	}
	parts := make([]part, len(inits))
	graphLen := len(gbody)
	for i, t := range inits {
		raw := t.RawData
		if len(raw) >= bigRaw {
			t.RawData = nil
		} else {
			raw = nil
		}
		small, err := opts.Marshal(t)
		if raw != nil {
			t.RawData = raw
		}
		if err != nil {
			return err
		}
		parts[i] = part{small, raw}
		tlen := len(small)
		if raw != nil {
			tlen += protowire.SizeTag(9) + protowire.SizeBytes(len(raw))
		}
		graphLen += protowire.SizeTag(5) + protowire.SizeBytes(tlen)
	}
	if total := int64(len(head)) + int64(protowire.SizeTag(7)+protowire.SizeBytes(graphLen)); total > maxProto {
		return fmt.Errorf("%w: the model would be %d bytes", ErrTooLarge, total)
	}
	buf := append([]byte(nil), head...)
	buf = protowire.AppendTag(buf, 7, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(graphLen))
	buf = append(buf, gbody...)
	if _, err := w.Write(buf); err != nil {
		return err
	}
	for _, p := range parts {
		tlen := len(p.small)
		if p.raw != nil {
			tlen += protowire.SizeTag(9) + protowire.SizeBytes(len(p.raw))
		}
		hdr := protowire.AppendTag(nil, 5, protowire.BytesType)
		hdr = protowire.AppendVarint(hdr, uint64(tlen))
		hdr = append(hdr, p.small...)
		if p.raw != nil {
			hdr = protowire.AppendTag(hdr, 9, protowire.BytesType)
			hdr = protowire.AppendVarint(hdr, uint64(len(p.raw)))
		}
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		if p.raw != nil {
			if _, err := w.Write(p.raw); err != nil {
				return err
			}
		}
	}
	return nil
}

func marshalDet(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// saveStream writes the model to path through a temporary file in the same
// directory, synced and renamed into place.
func saveStream(path string, mp *onnxpb.ModelProto) error {
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		if err := writeModel(w, mp); err != nil {
			return fmt.Errorf("encoding: %w", err)
		}
		return nil
	})
}

func hasBigRaw(g *onnxpb.GraphProto) bool {
	for _, t := range g.GetInitializer() {
		if len(t.RawData) >= bigRaw {
			return true
		}
	}
	return false
}
