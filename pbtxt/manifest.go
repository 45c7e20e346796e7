package pbtxt

import (
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

// ManifestTensors returns tensors as kiln.json records them (Triton data
// type names, full shapes).
func ManifestTensors(ts []TensorSig) []manifest.Tensor {
	out := make([]manifest.Tensor, 0, len(ts))
	for _, t := range ts {
		out = append(out, manifest.Tensor{Name: t.Name, Type: t.DataType.String(), Shape: t.Shape})
	}
	return out
}

// SignatureFromManifest returns the signature kiln.json records for a
// model: for a TensorRT plan, the only copy kiln can read.
func SignatureFromManifest(rec *manifest.Model) Signature {
	return Signature{Inputs: manifestSigs(rec.Inputs), Outputs: manifestSigs(rec.Outputs)}
}

func manifestSigs(ts []manifest.Tensor) []TensorSig {
	out := make([]TensorSig, 0, len(ts))
	for _, t := range ts {
		out = append(out, TensorSig{Name: t.Name, DataType: configpb.DataType(configpb.DataType_value[t.Type]), Shape: t.Shape})
	}
	return out
}

// PlanSignatures reads the signatures kiln recorded for the TensorRT plans
// of the repository that holds path (a repository, a model directory or a
// config file: the kiln.json of path, its parent or its grandparent), by
// model name. Without a kiln.json it returns nil: plans are then not
// checked against their configs.
func PlanSignatures(path string) (map[string]Signature, error) {
	for _, dir := range []string{path, filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
		mf := filepath.Join(dir, manifest.FileName)
		if st, err := os.Stat(mf); err != nil || !st.Mode().IsRegular() {
			continue
		}
		m, err := manifest.Read(mf)
		if err != nil {
			return nil, err
		}
		out := map[string]Signature{}
		for _, rec := range m.Models {
			if rec.Variant.Runtime != manifest.RuntimeTRT || len(rec.Inputs) == 0 {
				continue
			}
			out[rec.Name] = SignatureFromManifest(rec)
		}
		return out, nil
	}
	return nil, nil
}
