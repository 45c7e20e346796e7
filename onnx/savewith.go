package onnx

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

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
// an external data file. Both files are written to temporary names and
// renamed, the data file first, so a reader never sees a model whose data
// is missing. The model in memory is left as it was (weights stay loaded);
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

func saveExternal(path string, mp *onnxpb.ModelProto, o SaveOptions) (err error) {
	name := o.ExternalData
	if filepath.Base(name) != name || !filepath.IsLocal(name) || name == filepath.Base(path) {
		return fmt.Errorf("external data file %q must be a plain file name next to the model", name)
	}
	threshold := o.ExternalThreshold
	if threshold <= 0 {
		threshold = 1 << 10
	}
	dir := filepath.Dir(path)
	df, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	dtmp := df.Name()
	mtmp := ""
	defer func() {
		if err != nil {
			df.Close()
			os.Remove(dtmp)
			if mtmp != "" {
				os.Remove(mtmp)
			}
		}
	}()
	// Move the data out, remembering what to put back.
	type saved struct {
		t   *onnxpb.TensorProto
		raw []byte
	}
	var moved []saved
	defer func() {
		for _, s := range moved {
			s.t.RawData, s.t.ExternalData, s.t.DataLocation = s.raw, nil, nil
		}
	}()
	bw := bufio.NewWriterSize(df, 1<<20)
	var off int64
	loc := onnxpb.TensorProto_EXTERNAL
	for _, t := range mp.GetGraph().GetInitializer() {
		if len(t.RawData) < threshold || t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
			continue
		}
		if pad := (externalAlign - off%externalAlign) % externalAlign; pad > 0 {
			if _, err = bw.Write(make([]byte, pad)); err != nil {
				return err
			}
			off += pad
		}
		if _, err = bw.Write(t.RawData); err != nil {
			return err
		}
		moved = append(moved, saved{t, t.RawData})
		t.ExternalData = []*onnxpb.StringStringEntryProto{
			{Key: proto.String("location"), Value: proto.String(name)},
			{Key: proto.String("offset"), Value: proto.String(strconv.FormatInt(off, 10))},
			{Key: proto.String("length"), Value: proto.String(strconv.Itoa(len(t.RawData)))},
		}
		t.DataLocation = &loc
		off += int64(len(t.RawData))
		t.RawData = nil
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = df.Sync(); err != nil {
		return err
	}
	if err = df.Close(); err != nil {
		return err
	}
	data, err := marshalDet(mp)
	if err != nil {
		return err
	}
	if int64(len(data)) > maxProto {
		return fmt.Errorf("%w: even with large weights in %s the model is %d bytes", ErrTooLarge, name, len(data))
	}
	mf, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	mtmp = mf.Name()
	if _, err = mf.Write(data); err == nil {
		if err = mf.Sync(); err == nil {
			err = mf.Close()
		}
	}
	if err != nil {
		mf.Close()
		return err
	}
	for _, f := range []string{dtmp, mtmp} {
		if err = os.Chmod(f, 0o644); err != nil {
			return err
		}
	}
	if err = os.Rename(dtmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	if err = os.Rename(mtmp, path); err != nil {
		return errors.Join(err, os.Remove(filepath.Join(dir, name)))
	}
	return nil
}
