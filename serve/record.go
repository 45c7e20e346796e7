package serve

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/serve/report"
)

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
