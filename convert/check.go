package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/ort"
)

// CheckConfig says how every ONNX variant is checked before it is recorded
// as built: loaded in ONNX Runtime and compared with the fp32 source
// (internal/check, the checker kiln serve uses).
type CheckConfig struct {
	// Feed is the data to check with (--check-data, --input, --shape). When
	// it names no dataset and calibration recorded a validation split, the
	// split is used; else seeded random data, which judges fp32 and fp16
	// only (an int8 variant is then loaded and run but its accuracy is
	// "not judged").
	Feed check.FeedSpec
	// FS reads a gs:// dataset.
	FS dataset.FS
	// Thresholds override the defaults per model and output.
	Thresholds []check.Override
	// Session opens the variants and the reference (default: CPU).
	Session ort.SessionOptions
}

// CheckError says that a variant did not load, did not run, or missed a
// threshold; the variant is kept out of the repository.
type CheckError struct {
	Variant  string
	Failures []check.Failure
	Err      error // the load or run error, when it did not get that far
}

func (e *CheckError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("check: %v", e.Err) // the caller names the variant
	}
	parts := make([]string, len(e.Failures))
	for i, f := range e.Failures {
		parts[i] = f.String()
	}
	return fmt.Sprintf("check against fp32 failed: %s", strings.Join(parts, "; "))
}

// Unwrap returns the load or run error.
func (e *CheckError) Unwrap() error { return e.Err }

// reference is the fp32 source run once on the check's feeds.
type reference struct {
	ref  *check.Reference
	data check.Data
	err  error
}

// reference runs the source on the check's feeds, once per builder.
func (b *builder) reference(ctx context.Context) (*reference, error) {
	if b.checkRef != nil {
		return b.checkRef, b.checkRef.err
	}
	r := &reference{}
	b.checkRef = r
	// The reference is the fp32 model the variants are made from: the
	// source after the normalizer (its passes keep the outputs within
	// 1e-6; inputs fixed by --fix are gone from it).
	_, file, err := b.fp32Model()
	if err != nil {
		r.err = err
		return r, err
	}
	sess, err := ort.NewSession(file, b.cfg.Check.Session)
	if err != nil {
		r.err = fmt.Errorf("loading the fp32 model for the checks: %w", err)
		return r, r.err
	}
	defer sess.Close()
	spec := b.checkFeed()
	spec.Inputs = b.model.Inputs()
	feeds, data, err := check.Feeds(ctx, spec)
	if err != nil {
		r.err = fmt.Errorf("preparing the check inputs: %w", err)
		return r, r.err
	}
	r.data = data
	if r.ref, err = check.RunReference(ctx, ort.Runner{Session: sess}, feeds, nil); err != nil {
		r.err = fmt.Errorf("running the fp32 source for the checks: %w", err)
		return r, r.err
	}
	r.ref.Peaks = check.PeakOutputs(b.model)
	return r, r.err
}

// checkFeed picks the check's data: the flags', else calibration's
// validation split, else random data.
func (b *builder) checkFeed() check.FeedSpec {
	spec := b.cfg.Check.Feed
	spec.FS = b.cfg.Check.FS
	if spec.Samples == 0 {
		spec.Samples = 8 // a few samples: convert proves the variant sound, serve measures it
	}
	cal := b.cfg.Int8.Calibration
	if spec.Dataset == nil && len(spec.Named) == 0 && cal != nil && cal.Validation != nil {
		v := cal.Validation
		pre, err := dataset.ParsePreprocess(v.Preprocess)
		if err == nil {
			spec.Dataset = &dataset.Spec{Path: v.Path, Format: dataset.Format(v.Format), Preprocess: pre}
			spec.Indices = v.Indices
		}
	}
	return spec
}

// checkVariant loads the variant's model file in ONNX Runtime, runs it on
// the check's feeds and judges it against the fp32 source. It returns the
// record for kiln.json and a *CheckError when the variant must not be
// recorded as built.
func (b *builder) checkVariant(ctx context.Context, v manifest.Variant, model, file string) (json.RawMessage, string, error) {
	ref, err := b.reference(ctx)
	if err != nil {
		return nil, "", err
	}
	sess, err := ort.NewSession(file, b.cfg.Check.Session)
	if err != nil {
		return nil, "", &CheckError{Variant: v.ID(), Err: fmt.Errorf("it does not load in ONNX Runtime: %w", err)}
	}
	defer sess.Close()
	res, err := ref.ref.Compare(ctx, ort.Runner{Session: sess}, func(output string) check.Thresholds {
		return check.Resolve(check.Defaults(v.Precision), b.cfg.Check.Thresholds, model, output)
	})
	if err != nil {
		return nil, "", &CheckError{Variant: v.ID(), Err: err}
	}
	rec := check.Record{By: "convert", Checked: time.Now().UTC(), Data: ref.data, Outputs: res.Outputs, Device: string(b.cfg.Check.Session.Provider)}
	note := ""
	switch {
	case !res.Passed():
		rec.Verdict = check.VerdictFail
		rec.Worst = &res.Failures[0]
	case v.Precision == manifest.INT8 && !ref.data.Real():
		rec.Verdict, rec.Reason = check.VerdictNotJudged, "needs real data: random inputs cannot judge int8 accuracy"
		note = "loaded and ran; accuracy not judged (random check data: give --check-data)"
	default:
		rec.Verdict = check.VerdictPass
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, "", err
	}
	if !res.Passed() {
		return raw, "", &CheckError{Variant: v.ID(), Failures: res.Failures}
	}
	return raw, note, nil
}
