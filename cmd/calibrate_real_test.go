package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/ortest"
	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/ort"
)

// vadSamples writes n .npz samples of Silero VAD's streaming inputs: each
// 512-sample chunk of the synthetic speech with the recurrent state the
// fp32 model left after the chunks before it, as a client would send.
func vadSamples(t *testing.T, model string, n int) string {
	t.Helper()
	ortest.Init(t)
	s, err := ort.NewSession(model, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir, audio := t.TempDir(), syntheticSpeech(n*512)
	state, _ := onnx.NewTensor("state", []int64{2, 1, 128}, make([]float32, 256))
	sr, _ := onnx.NewTensor("sr", []int64{}, []int64{16000})
	for c := range n {
		in, _ := onnx.NewTensor("input", []int64{1, 512}, audio[c*512:(c+1)*512])
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("chunk%03d.npz", c)))
		if err != nil {
			t.Fatal(err)
		}
		if err := dataset.WriteNpz(f, map[string]*onnx.Tensor{"input": in, "state": state}); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		out, err := s.Run(context.Background(), map[string]*onnx.Tensor{"input": in, "state": state, "sr": sr}, nil)
		if err != nil {
			t.Fatal(err)
		}
		state = out["stateN"]
		state.Name = "state"
	}
	return dir
}

// Silero VAD v5 computes inside If branches chosen by sr: with --fix
// sr=16000 it calibrates on streaming chunks, its Convs quantized per
// channel, and its int8 model is validated against fp32.
func TestRealSileroCalibrate(t *testing.T) {
	vad := testutil.NPMModel(t, "silero_vad_v5.onnx")
	data, out := vadSamples(t, vad, 64), filepath.Join(t.TempDir(), "calib")
	stdout, errOut, code := run(t, "calibrate", vad, "--fix", "sr=16000", "--data", data, "-o", out, "--format", "json", "--progress", "none")
	if code != 0 {
		t.Fatalf("calibrate silero --fix sr=16000 = exit %d\n%s\n%s", code, stdout, errOut)
	}
	var rep struct {
		Quantization struct {
			Weights []struct {
				Axis int `json:"axis"`
			} `json:"weights"`
		} `json:"quantization"`
		Accuracy struct {
			Outputs []struct {
				Output string  `json:"output"`
				Cosine float64 `json:"cosine"`
			} `json:"outputs"`
		} `json:"accuracy"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("calibrate --format json: %v\n%s", err, stdout)
	}
	perChannel := 0
	for _, w := range rep.Quantization.Weights {
		if w.Axis >= 0 {
			perChannel++
		}
	}
	if perChannel == 0 || len(rep.Accuracy.Outputs) == 0 {
		t.Fatalf("silero int8: %d per-channel weights, accuracy %+v; want per-channel Conv weights and an accuracy report", perChannel, rep.Accuracy)
	}
	for _, o := range rep.Accuracy.Outputs {
		t.Logf("silero int8 %s: cosine %.4f against fp32 (%d weights per channel)", o.Output, o.Cosine, perChannel)
	}
}
