package pbtxt

import (
	"fmt"
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
// model: for a TensorRT plan, the only copy kiln can read. Its Profiles
// come from the recorded trtexec command (PlanProfiles); a command that
// does not parse leaves them nil, and PlanSignatures reports it.
func SignatureFromManifest(rec *manifest.Model) Signature {
	sig := Signature{Inputs: manifestSigs(rec.Inputs), Outputs: manifestSigs(rec.Outputs)}
	sig.Profiles, _ = PlanProfiles(rec)
	return sig
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
// model name, with the optimization profiles their recorded trtexec
// commands built. Without a kiln.json it returns nil: plans are then not
// checked against their configs. A recorded command kiln cannot read is an
// error, as a kiln.json that does not parse is.
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
			profiles, err := PlanProfiles(rec)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", mf, err)
			}
			out[rec.Name] = Signature{Inputs: manifestSigs(rec.Inputs), Outputs: manifestSigs(rec.Outputs), Profiles: profiles}
		}
		return out, nil
	}
	return nil, nil
}
