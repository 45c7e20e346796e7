package onnx

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

// SaveOptions control how Save writes weights.
type SaveOptions struct {
	// ExternalData is the name of a file next to the model that receives the
	// raw data of every main-graph initializer of at least ExternalThreshold
	// bytes, each at a 4096-byte aligned offset (ONNX's external data format,
	// which ONNX Runtime and TensorRT read). Empty keeps everything inline.
	ExternalData string
	// ExternalThreshold is the smallest initializer moved out (default 1 KiB).
	ExternalThreshold int
}

const externalAlign = 4096

// SaveWith writes the model like Save, optionally with its large weights in
// an external data file. Each file is written to a temporary name and
// renamed, the data file first, so the new model never refers to data that
// is not there yet. The model in memory is left as it was (weights stay loaded);
// SaveWith must not run concurrently with other use of the model.
func (m *Model) SaveWith(path string, o SaveOptions) error {
	if o.ExternalData == "" {
		return m.Save(path)
	}
	if err := saveExternal(path, m.Proto, o); err != nil {
		return fmt.Errorf("saving ONNX model %s: %w", path, err)
	}
	return nil
}

func saveExternal(path string, mp *onnxpb.ModelProto, o SaveOptions) error {
	name := o.ExternalData
	if filepath.Base(name) != name || !filepath.IsLocal(name) || name == filepath.Base(path) {
		return fmt.Errorf("external data file %q must be a plain file name next to the model", name)
	}
	threshold := o.ExternalThreshold
	if threshold <= 0 {
		threshold = 1 << 10
	}
	// Move the data out, remembering what to put back.
	type moved struct {
		t   *onnxpb.TensorProto
		raw []byte
	}
	var out []moved
	defer func() {
		for _, m := range out {
			m.t.RawData, m.t.ExternalData, m.t.DataLocation = m.raw, nil, nil
		}
	}()
	loc := onnxpb.TensorProto_EXTERNAL
	err := atomicfile.Write(filepath.Join(filepath.Dir(path), name), 0o644, func(w io.Writer) error {
		var off int64
		for _, t := range mp.GetGraph().GetInitializer() {
			if len(t.RawData) < threshold || t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
				continue
			}
			if pad := (externalAlign - off%externalAlign) % externalAlign; pad > 0 {
				if _, err := w.Write(make([]byte, pad)); err != nil {
					return err
				}
				off += pad
			}
			if _, err := w.Write(t.RawData); err != nil {
				return err
			}
			out = append(out, moved{t, t.RawData})
			t.ExternalData = []*onnxpb.StringStringEntryProto{
				{Key: proto.String("location"), Value: proto.String(name)},
				{Key: proto.String("offset"), Value: proto.String(strconv.FormatInt(off, 10))},
				{Key: proto.String("length"), Value: proto.String(strconv.Itoa(len(t.RawData)))},
			}
			t.DataLocation = &loc
			off += int64(len(t.RawData))
			t.RawData = nil
		}
		return nil
	})
	if err != nil {
		return err
	}
	data, err := marshalDet(mp)
	if err != nil {
		return err
	}
	if int64(len(data)) > maxProto {
		return fmt.Errorf("%w: even with large weights in %s the model is %d bytes", ErrTooLarge, name, len(data))
	}
	// The data file is in place before the model that refers to it.
	return atomicfile.WriteFile(path, data, 0o644)
}
