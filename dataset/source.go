package dataset

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/onnx"
)

// Sample is one example: a tensor per model input, keyed by input name, and
// the place it came from. See the package comment for the batch dimension.
type Sample struct {
	// ID names the sample's origin: a file ("data/cat.jpg"), a record or row
	// of a file ("calib.tfrecord#17", "inputs.npz#3").
	ID      string
	Tensors map[string]*onnx.Tensor
	// Label is the class label stored with the sample (a TFRecord's
	// image/class/label), or -1 when there is none.
	Label int64
}

// Source is an opened dataset. It holds an index, not the samples: Sample
// reads sample i (0 <= i < Len()) when asked. Sources are safe for
// concurrent use.
type Source interface {
	Len() int
	Sample(ctx context.Context, i int) (Sample, error)
}

// Format is the kind of files a dataset holds.
type Format string

// Formats Open recognizes. The zero Format detects the kind from file names.
const (
	Auto     Format = ""
	Images   Format = "images"   // .jpg, .jpeg, .png
	NumPy    Format = "numpy"    // .npy, .npz
	ProtoPB  Format = "pb"       // ONNX TensorProto files
	TFRecord Format = "tfrecord" // .tfrecord, .tfrecords, NAME-00000-of-00010
	KServe   Format = "json"     // KServe v2 request bodies, perf_analyzer input data
)

// Spec says what to open and how to turn it into model inputs.
type Spec struct {
	// Path is a file or directory, local or gs://bucket/prefix.
	Path   string
	Format Format
	// Inputs is the model signature (onnx.Model.Inputs). It names the
	// tensors of images and .pb files, decides how stacked files are split,
	// and fills in what Preprocess leaves unset. It may be nil.
	Inputs []onnx.ValueInfo
	// Preprocess turns images (files or TFRecord features) into tensors.
	Preprocess Preprocess
	// ImageKey is the tf.Example feature holding the encoded image
	// (default "image/encoded"); LabelKey the optional int64 class label
	// (default "image/class/label").
	ImageKey, LabelKey string
}

// Validate checks the spec's fields on their own.
func (s Spec) Validate() error {
	if s.Path == "" {
		return errors.New("dataset path is empty")
	}
	switch s.Format {
	case Auto, Images, NumPy, ProtoPB, TFRecord, KServe:
	default:
		return fmt.Errorf("unknown dataset format %q (want images, numpy, pb, tfrecord or json)", s.Format)
	}
	return s.Preprocess.Validate()
}

// ErrNoSamples is wrapped by the error Open returns for an empty dataset.
var ErrNoSamples = errors.New("no samples found")

// SampleError is a problem with one sample: unreadable, corrupt, or not
// matching the model. Callers may skip such samples.
type SampleError struct {
	Sample string // the sample's ID
	Tensor string // the tensor, when the problem is one tensor
	Err    error
}

// Error names the sample, the tensor if any, and the problem.
func (e *SampleError) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("sample %s: tensor %q: %v", e.Sample, e.Tensor, e.Err)
	}
	return fmt.Sprintf("sample %s: %v", e.Sample, e.Err)
}

// Unwrap returns the underlying error.
func (e *SampleError) Unwrap() error { return e.Err }

func sampleErr(id, tensor string, err error) error {
	var se *SampleError
	if errors.As(err, &se) && se.Sample == id {
		return err
	}
	return &SampleError{Sample: id, Tensor: tensor, Err: err}
}

var (
	shardRE   = regexp.MustCompile(`-\d{5}-of-\d{5}$`)
	pbInputRE = regexp.MustCompile(`^input_(\d+)\.pb$`)
)

// formatOf classifies one file name; "" means the file is not data.
func formatOf(name string) Format {
	base := strings.ToLower(path.Base(name))
	switch path.Ext(base) {
	case ".jpg", ".jpeg", ".png":
		return Images
	case ".npy", ".npz":
		return NumPy
	case ".pb":
		return ProtoPB
	case ".tfrecord", ".tfrecords", ".tfr":
		return TFRecord
	case ".json":
		return KServe
	}
	if strings.Contains(base, ".tfrecord") || shardRE.MatchString(base) {
		return TFRecord
	}
	return ""
}

// Open indexes the dataset at spec.Path. fsys reads every name; nil means
// Local, which refuses gs:// paths with ErrNeedGCS.
func Open(ctx context.Context, spec Spec, fsys FS) (Source, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if fsys == nil {
		if isGCS(spec.Path) {
			return nil, fmt.Errorf("opening dataset %s: %w", spec.Path, ErrNeedGCS)
		}
		fsys = Local{}
	}
	src, err := open(ctx, spec, fsys)
	if err != nil {
		return nil, fmt.Errorf("opening dataset %s: %w", spec.Path, err)
	}
	if src.Len() == 0 {
		return nil, emptyError(spec.Path)
	}
	return src, nil
}

func emptyError(p string) error {
	return fmt.Errorf("%w in %s: expected images (.jpg, .png), .npy/.npz, .pb, .tfrecord or .json", ErrNoSamples, p)
}

func open(ctx context.Context, spec Spec, fsys FS) (Source, error) {
	format := spec.Format
	names, err := listSorted(ctx, fsys, spec.Path)
	if err != nil {
		return nil, err
	}
	single := len(names) == 1 && names[0] == spec.Path
	if single && format == Auto {
		format = formatOf(spec.Path)
	}
	if !single {
		byFormat := map[Format][]string{}
		for _, n := range names {
			f := formatOf(n)
			if f == ProtoPB && !pbInputRE.MatchString(path.Base(n)) {
				continue // output_N.pb next to input_N.pb
			}
			if f != "" {
				byFormat[f] = append(byFormat[f], n)
			}
		}
		if format == Auto {
			var kinds []string
			for f := range byFormat {
				kinds = append(kinds, string(f))
				format = f
			}
			if len(kinds) > 1 {
				sort.Strings(kinds)
				return nil, fmt.Errorf("directory mixes %s files: choose one format", strings.Join(kinds, ", "))
			}
		}
		names = byFormat[format]
	}
	if len(names) == 0 || format == Auto {
		return nil, emptyError(spec.Path)
	}
	switch format {
	case Images:
		return newImageSource(spec, fsys, names)
	case NumPy:
		if single {
			return openStacked(ctx, spec, fsys, names[0])
		}
		return newNpzDir(spec, fsys, names)
	case ProtoPB:
		return openPB(ctx, spec, fsys, names, single)
	case TFRecord:
		return openTFRecord(ctx, spec, fsys, names)
	case KServe:
		return openJSON(ctx, spec, fsys, names)
	}
	return nil, fmt.Errorf("unknown dataset format %q", format)
}

// unitSource serves samples from units (a .pb set, a JSON file) that each
// hold one or more rows. Open loads every unit once to count its rows; a
// Sample loads its unit again, keeping only the most recent one.
type unitSource struct {
	fsys   FS
	units  []string // unit names
	starts []int    // starts[i] is the index of unit i's first sample; one extra entry at the end
	load   func(ctx context.Context, fsys FS, unit string) ([]Sample, error)

	mu       sync.Mutex
	lastUnit string
	last     []Sample
}

func (u *unitSource) add(unit string, rows int) {
	if len(u.starts) == 0 {
		u.starts = []int{0}
	}
	u.units = append(u.units, unit)
	u.starts = append(u.starts, u.starts[len(u.starts)-1]+rows)
}

func (u *unitSource) Len() int {
	if len(u.starts) == 0 {
		return 0
	}
	return u.starts[len(u.starts)-1]
}

func (u *unitSource) Sample(ctx context.Context, i int) (Sample, error) {
	if i < 0 || i >= u.Len() {
		return Sample{}, fmt.Errorf("sample %d out of range [0,%d)", i, u.Len())
	}
	k := sort.SearchInts(u.starts, i+1) - 1
	unit := u.units[k]
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.lastUnit != unit || u.last == nil {
		rows, err := u.load(ctx, u.fsys, unit)
		if err != nil {
			return Sample{}, err
		}
		u.lastUnit, u.last = unit, rows
	}
	row := i - u.starts[k]
	if row >= len(u.last) {
		return Sample{}, sampleErr(unit, "", fmt.Errorf("file changed since it was opened: %d samples, want %d", len(u.last), u.starts[k+1]-u.starts[k]))
	}
	return u.last[row], nil
}
