package calibrate

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/manifest"
)

// OutputError says that a directory is not one Run wrote, and why. It is
// the error for a missing directory, a file, or a directory without the
// files a calibrated variant is built from, so that callers can say how to
// make one (run calibrate into it first).
type OutputError struct {
	Dir    string
	Reason string // e.g. "it holds no ranges.json"
	Err    error  // the underlying error, if any (fs.ErrNotExist for a missing directory)
}

// Error names the directory and what is wrong with it.
func (e *OutputError) Error() string {
	return fmt.Sprintf("%s is not a calibration output directory: %s", e.Dir, e.Reason)
}

// Unwrap returns the underlying error.
func (e *OutputError) Unwrap() error { return e.Err }

// ReadOutput reads the directory Run wrote into what the int8 variants are
// built from: the paths of the Q/DQ model and the TensorRT cache (each
// empty when missing, as the cache is unless Config.TRTCache asked for it;
// one of them must be there), the model digest and the calibration record
// from ranges.json (which must be there and valid), and the scope and the
// Q/DQ model's agreement with fp32 on its first output from report.json
// (empty and zero without the report; zero without validation samples).
func ReadOutput(dir string) (manifest.CalibrationOutput, error) {
	out := manifest.CalibrationOutput{Dir: dir}
	if err := checkOutput(dir, &out); err != nil {
		return manifest.CalibrationOutput{}, err
	}
	r, err := ReadRanges(filepath.Join(dir, RangesFile))
	if err != nil {
		return manifest.CalibrationOutput{}, err
	}
	out.Model = r.ModelDigest
	out.Calibration = manifest.Calibration{Method: string(r.Method), Dataset: r.DatasetDigest, Samples: r.Samples}
	rep, err := readReport(filepath.Join(dir, ReportJSON))
	if err != nil {
		return manifest.CalibrationOutput{}, err
	}
	if rep != nil {
		out.Calibration.Scope = string(rep.Scope)
		if t := rep.Target; t != nil && t.Met {
			out.Calibration.Target, out.Calibration.Int8Share = t.Target.String(), t.Int8Share
			for _, l := range t.Kept {
				out.Calibration.KeptFP32 = append(out.Calibration.KeptFP32, cmp.Or(l.Node, l.Output))
			}
		}
		out.ValidationSamples = rep.ValidationSamples
		out.Validation = rep.ValidationSplit
		if rep.Accuracy != nil && len(rep.Accuracy.Outputs) > 0 {
			first := rep.Accuracy.Outputs[0]
			out.Calibration.Cosine, out.Calibration.Top1Agreement = first.Cosine, first.Top1
		}
	}
	return out, nil
}

// checkOutput tells an *OutputError from a directory that only needs
// parsing, and fills in the paths of the Q/DQ model and the cache it holds.
func checkOutput(dir string, out *manifest.CalibrationOutput) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return &OutputError{Dir: dir, Reason: "it does not exist", Err: err}
	case err != nil:
		return fmt.Errorf("reading calibration output: %w", err)
	case !st.IsDir():
		return &OutputError{Dir: dir, Reason: "it is a file, not a directory"}
	}
	for name, dst := range map[string]*string{ModelFile: &out.QDQModel, CacheFile: &out.Cache} {
		p := filepath.Join(dir, name)
		ok, err := exists(p)
		if err != nil {
			return fmt.Errorf("reading calibration output: %w", err)
		}
		if ok {
			*dst = p
		}
	}
	if out.QDQModel == "" && out.Cache == "" {
		return &OutputError{Dir: dir, Reason: fmt.Sprintf("it holds neither %s nor %s", ModelFile, CacheFile)}
	}
	ok, err := exists(filepath.Join(dir, RangesFile))
	if err != nil {
		return fmt.Errorf("reading calibration output: %w", err)
	}
	if !ok {
		return &OutputError{Dir: dir, Reason: "it holds no " + RangesFile, Err: os.ErrNotExist}
	}
	return nil
}

// readReport reads a report.json Run wrote; a missing one is no error but
// a nil report, since the report only adds to what ranges.json records.
func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("reading report %s: %w", path, err)
	}
	return &r, nil
}

// exists tells whether path exists; an error other than its absence (no
// permission) is returned, not taken for absence.
func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
