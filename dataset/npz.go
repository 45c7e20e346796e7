package dataset

import (
	"archive/zip"
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/onnx"
)

// ReadNpz reads every array of a .npz archive (a ZIP of .npy members,
// stored or deflated), keyed by member name without ".npy".
func ReadNpz(r io.ReaderAt, size int64) (map[string]*onnx.Tensor, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("reading npz: %w", err)
	}
	out := map[string]*onnx.Tensor{}
	for _, f := range zr.File {
		name, ok := npzKey(f.Name)
		if !ok {
			continue
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("npz member %s: array %q appears twice", f.Name, name)
		}
		rc, err := f.Open()
		if err != nil {
			return nil, fmt.Errorf("npz member %s: %w", f.Name, err)
		}
		t, err := ReadNpy(rc, name)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("npz member %s: %w", f.Name, err)
		}
		out[name] = t
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("npz archive has no .npy members")
	}
	return out, nil
}

func npzKey(member string) (string, bool) {
	if strings.HasSuffix(member, "/") || !strings.HasSuffix(member, ".npy") {
		return "", false
	}
	return strings.TrimSuffix(member, ".npy"), true
}

// WriteNpz writes tensors as a .npz archive of stored (uncompressed) .npy
// members named after the tensors, in name order, as numpy.savez does.
func WriteNpz(w io.Writer, tensors map[string]*onnx.Tensor) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	zw := zip.NewWriter(w)
	for _, n := range names {
		f, err := zw.CreateHeader(&zip.FileHeader{Name: n + ".npy", Method: zip.Store})
		if err != nil {
			return err
		}
		if err := WriteNpy(f, tensors[n]); err != nil {
			return err
		}
	}
	return zw.Close()
}

// npyLoc is where one array of a stacked file lives.
type npyLoc struct {
	name   string
	h      *npyHeader
	member string // npz member name; "" for a .npy file
	offset int64  // of the array data in the file, -1 when the member is compressed
}

// stackedSource is one .npy or .npz file. Split along dimension 0, each
// sample is read with a range read of its rows (for compressed members, by
// decompressing up to them).
type stackedSource struct {
	spec  Spec
	fsys  FS
	file  string
	locs  []npyLoc
	rows  int
	split bool
}

func openStacked(ctx context.Context, spec Spec, fsys FS, file string) (Source, error) {
	s := &stackedSource{spec: spec, fsys: fsys, file: file}
	if strings.HasSuffix(strings.ToLower(file), ".npy") {
		rc, err := fsys.Open(ctx, file)
		if err != nil {
			return nil, err
		}
		h, err := readNpyHeader(rc)
		rc.Close()
		if err != nil {
			return nil, sampleErr(file, "", err)
		}
		name, err := singleInput(spec.Inputs, file)
		if err != nil {
			return nil, err
		}
		s.locs = []npyLoc{{name: name, h: h, offset: h.HeaderLen}}
	} else {
		ra, size, closeFn, err := readerAt(ctx, fsys, file)
		if err != nil {
			return nil, err
		}
		defer closeFn()
		zr, err := zip.NewReader(ra, size)
		if err != nil {
			return nil, sampleErr(file, "", fmt.Errorf("reading npz: %w", err))
		}
		for _, f := range zr.File {
			name, ok := npzKey(f.Name)
			if !ok {
				continue
			}
			rc, err := f.Open()
			if err != nil {
				return nil, sampleErr(file, name, err)
			}
			h, err := readNpyHeader(rc)
			rc.Close()
			if err != nil {
				return nil, sampleErr(file, name, err)
			}
			off := int64(-1)
			if f.Method == zip.Store {
				if off, err = f.DataOffset(); err != nil {
					return nil, sampleErr(file, name, err)
				}
				off += h.HeaderLen
			}
			s.locs = append(s.locs, npyLoc{name: name, h: h, member: f.Name, offset: off})
		}
		sort.Slice(s.locs, func(i, j int) bool { return s.locs[i].name < s.locs[j].name })
	}
	shapes := map[string]*onnx.Tensor{}
	for _, l := range s.locs {
		shapes[l.name] = &onnx.Tensor{Name: l.name, Dims: l.h.Dims}
	}
	if len(shapes) == 0 {
		return &stackedSource{}, nil
	}
	rows, split, err := splitRows(spec.Inputs, shapes)
	if err != nil {
		return nil, sampleErr(file, "", err)
	}
	s.rows, s.split = rows, split
	return s, nil
}

// singleInput names the tensor of a .npy file: the model's only input, or "input".
func singleInput(sig []onnx.ValueInfo, file string) (string, error) {
	switch len(sig) {
	case 0:
		return "input", nil
	case 1:
		return sig[0].Name, nil
	}
	return "", fmt.Errorf("%s: a .npy file holds one tensor but the model has inputs %s: use .npz files keyed by input name", file, inputNames(sig))
}

func (s *stackedSource) Len() int { return s.rows }

func (s *stackedSource) Sample(ctx context.Context, i int) (Sample, error) {
	if i < 0 || i >= s.rows {
		return Sample{}, fmt.Errorf("sample %d out of range [0,%d)", i, s.rows)
	}
	id := s.file
	if s.split {
		id = fmt.Sprintf("%s#%d", s.file, i)
	}
	out := Sample{ID: id, Label: -1, Tensors: map[string]*onnx.Tensor{}}
	for _, l := range s.locs {
		h := *l.h
		start, length := int64(0), h.DataSize
		if s.split {
			length = h.DataSize / int64(s.rows)
			start = int64(i) * length
			h.Dims = h.Dims[1:]
			h.DataSize = length
		}
		raw, err := s.read(ctx, l, start, length)
		if err != nil {
			return Sample{}, sampleErr(id, l.name, err)
		}
		t, err := npyDecode(&h, raw, l.name)
		if err != nil {
			return Sample{}, sampleErr(id, l.name, err)
		}
		out.Tensors[l.name] = t
	}
	return out, nil
}

// read returns length bytes of an array's data starting at start.
func (s *stackedSource) read(ctx context.Context, l npyLoc, start, length int64) ([]byte, error) {
	var r io.Reader
	if l.offset >= 0 {
		rc, err := openRange(ctx, s.fsys, s.file, l.offset+start, length)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		r = rc
	} else {
		ra, size, closeFn, err := readerAt(ctx, s.fsys, s.file)
		if err != nil {
			return nil, err
		}
		defer closeFn()
		zr, err := zip.NewReader(ra, size)
		if err != nil {
			return nil, err
		}
		f := findMember(zr, l.member)
		if f == nil {
			return nil, fmt.Errorf("member %s is gone", l.member)
		}
		rc, err := f.Open()
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		if _, err := io.CopyN(io.Discard, rc, l.h.HeaderLen+start); err != nil {
			return nil, noEOF(err)
		}
		r = rc
	}
	raw := make([]byte, length)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("reading array data: %w", noEOF(err))
	}
	return raw, nil
}

func findMember(zr *zip.Reader, name string) *zip.File {
	for _, f := range zr.File {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// npzDir is a directory of .npz or .npy files, one sample per file.
type npzDir struct {
	spec  Spec
	fsys  FS
	names []string
}

func newNpzDir(spec Spec, fsys FS, names []string) (Source, error) {
	return &npzDir{spec: spec, fsys: fsys, names: names}, nil
}

func (d *npzDir) Len() int { return len(d.names) }

func (d *npzDir) Sample(ctx context.Context, i int) (Sample, error) {
	if i < 0 || i >= len(d.names) {
		return Sample{}, fmt.Errorf("sample %d out of range [0,%d)", i, len(d.names))
	}
	file := d.names[i]
	out := Sample{ID: file, Label: -1}
	if path.Ext(strings.ToLower(file)) == ".npy" {
		name, err := singleInput(d.spec.Inputs, file)
		if err != nil {
			return Sample{}, err
		}
		rc, err := d.fsys.Open(ctx, file)
		if err != nil {
			return Sample{}, sampleErr(file, "", err)
		}
		defer rc.Close()
		t, err := ReadNpy(rc, name)
		if err != nil {
			return Sample{}, sampleErr(file, "", err)
		}
		out.Tensors = map[string]*onnx.Tensor{name: t}
		return out, nil
	}
	ra, size, closeFn, err := readerAt(ctx, d.fsys, file)
	if err != nil {
		return Sample{}, sampleErr(file, "", err)
	}
	defer closeFn()
	ts, err := ReadNpz(ra, size)
	if err != nil {
		return Sample{}, sampleErr(file, "", err)
	}
	out.Tensors = ts
	return out, nil
}
