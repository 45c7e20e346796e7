package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/serve/report"
)

// perf times an opened artifact over the sweep, or returns nil when timing
// is disabled or fails (the failure is noted in m.Reason: a model that
// answered every check but cannot be timed still passed its checks).
func (r *runner) perf(ctx context.Context, m *report.Model, a Artifact, s Session, feed check.Feed) *report.Perf {
	c := r.cfg.Perf.withDefaults()
	if r.cfg.Perf.Disabled {
		return nil
	}
	if t, ok := s.(timer); ok {
		var perfs []report.PerfPoint
		var out *report.Perf
		for _, b := range c.batchesFor(a.MaxBatch, feed.Batched) {
			in, err := batchOf(feed, b)
			if err == nil {
				out, err = t.time(ctx, in, b)
			}
			if err != nil {
				m.Reason = joinReason(m.Reason, "not timed: "+err.Error())
				return nil
			}
			perfs = append(perfs, out.Points...)
		}
		out.Points = perfs
		return out
	}
	points, err := Sweep(ctx, s, feed, c.batchesFor(a.MaxBatch, feed.Batched), c)
	if err != nil {
		m.Reason = joinReason(m.Reason, "not timed: "+err.Error())
		return nil
	}
	in, _ := batchOf(feed, 1)
	over := LoopOverhead(ctx, in)
	p := &report.Perf{Warmup: c.Warmup, MeasurementWindow: c.Window, Overhead: report.LoopOverhead{PerRequestUS: us(over)}}
	for _, pt := range points {
		p.Points = append(p.Points, report.PerfPoint{
			Concurrency: pt.Concurrency, Batch: pt.Batch, Requests: pt.Requests,
			ThroughputInferPerSec: pt.Throughput(), LatencyAvgUS: us(pt.Mean()),
			LatencyP50US: us(pt.Percentile(50)), LatencyP90US: us(pt.Percentile(90)),
			LatencyP95US: us(pt.Percentile(95)), LatencyP99US: us(pt.Percentile(99)),
			LatencyMinUS: us(pt.Percentile(0)), LatencyMaxUS: us(pt.Percentile(100)),
		})
	}
	if len(p.Points) > 0 && p.Points[0].LatencyAvgUS > 0 {
		p.Overhead.Share = p.Overhead.PerRequestUS / p.Points[0].LatencyAvgUS
	}
	return p
}

// timer is a session that times itself (trtexec's own measurement)
// rather than being timed by serve's loop.
type timer interface {
	time(ctx context.Context, in map[string]*onnx.Tensor, batch int) (*report.Perf, error)
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// recordChecks writes every checked model's record into the repository's
// kiln.json (atomically); a repository without kiln.json is left alone.
func recordChecks(dir string, man *manifest.Manifest, rep *report.Report) error {
	if man == nil {
		return nil
	}
	for i := range rep.Models {
		rm := &rep.Models[i]
		mm := man.Model(rm.Name)
		if mm == nil {
			continue
		}
		rec := check.Record{Verdict: check.Verdict(rm.Verdict), Reason: rm.Reason, By: "serve", Checked: rep.Created,
			Data: checkData(rep.Data), Device: rep.Device, Worst: rm.Worst(), Outputs: rm.Outputs}
		if rm.Perf != nil && len(rm.Perf.Points) > 0 {
			rec.LatencyP50US = rm.Perf.Points[0].LatencyP50US
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("recording the checks of %s: %w", rm.Name, err)
		}
		mm.Checks = b
	}
	data, err := man.Marshal()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, manifest.FileName), data, 0o644)
}

// checkData converts the report's data description back for kiln.json.
func checkData(d report.Data) check.Data {
	return check.Data{Kind: check.DataKind(d.Kind), Path: d.Path, Samples: d.Samples, Seed: d.Seed}
}
