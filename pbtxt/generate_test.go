package pbtxt

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

func signatureOf(t *testing.T, ins, outs []tensor) Signature {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.onnx")
	writeONNX(t, path, ins, outs)
	sig, err := LoadSignature(path)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func TestGenerateGolden(t *testing.T) {
	sig := signatureOf(t, classifierIO.ins, classifierIO.outs)
	for _, tc := range []struct {
		name string
		opts GenerateOptions
	}{
		{"defaults", GenerateOptions{Name: "resnet50_onnx_fp32"}},
		{"deployment", GenerateOptions{
			Name: "resnet50_onnx_fp16_b16_x2", MaxBatchSize: 16, PreferredBatchSizes: []int32{8, 16}, MaxQueueDelayMicros: 100,
			InstanceCount: 2, InstanceKind: "gpu", InstanceGPUs: []int32{0, 1}, LabelsFile: "labels.txt",
			LatestVersions: 2, Warmup: "random", WarmupBatchSize: 4,
			TensorRTAccelerator: true, TensorRTPrecision: "fp16", TensorRTWorkspaceBytes: 1 << 30,
			ResponseCache: true, Parameters: map[string]string{"intra_op_thread_count": "4", "cudnn_conv_algo_search": "1"},
		}},
		{"no_batching", GenerateOptions{Name: "fixed", MaxBatchSize: -1, InstanceKind: "cpu", AllVersions: true, Warmup: "zero"}},
		{"complete", GenerateOptions{Name: "complete", Complete: true, GPUs: []int32{0, 1}}},
	} {
		c, err := Generate(sig, tc.opts)
		if err != nil {
			t.Fatalf("Generate(%s) = %v", tc.name, err)
		}
		testutil.Golden(t, tc.name, Print(c))
		if ps := Validate(c, ValidateOptions{DirName: tc.opts.Name}); ps.HasErrors() {
			t.Errorf("Validate(Generate(%s)) = %v, want no errors", tc.name, ps)
		}
	}
}

func TestGenerateBatchDetection(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ins, outs []tensor
		opts      GenerateOptions
		wantMBS   int32
		wantDims  []int64
		wantErr   string
		reshaped  bool
		dynBatch  bool
	}{
		{name: "dynamic first dim", ins: classifierIO.ins, outs: classifierIO.outs, wantMBS: 4, wantDims: []int64{3, 224, 224}, dynBatch: true},
		{name: "fixed first dim", ins: []tensor{{"x", onnx.Float, []int64{1, 3}}}, outs: []tensor{{"y", onnx.Float, []int64{1, 3}}}, wantMBS: 0, wantDims: []int64{1, 3}},
		{name: "one output fixed", ins: []tensor{{"x", onnx.Float, []int64{-1, 3}}}, outs: []tensor{{"y", onnx.Float, []int64{2}}}, wantMBS: 0, wantDims: []int64{-1, 3}},
		{name: "explicit max batch", ins: classifierIO.ins, outs: classifierIO.outs, opts: GenerateOptions{MaxBatchSize: 32}, wantMBS: 32, wantDims: []int64{3, 224, 224}, dynBatch: true},
		{name: "batch 1 has no dynamic batching", ins: classifierIO.ins, outs: classifierIO.outs, opts: GenerateOptions{MaxBatchSize: 1}, wantMBS: 1, wantDims: []int64{3, 224, 224}},
		{name: "scalar per item", ins: []tensor{{"x", onnx.Int64, []int64{-1}}}, outs: []tensor{{"y", onnx.Int64, []int64{-1}}}, wantMBS: 4, wantDims: []int64{1}, reshaped: true, dynBatch: true},
		{name: "batching forced on fixed model", ins: []tensor{{"x", onnx.Float, []int64{1, 3}}}, outs: []tensor{{"y", onnx.Float, []int64{1, 3}}}, opts: GenerateOptions{MaxBatchSize: 8}, wantErr: "does not support batching"},
		{name: "true scalar", ins: []tensor{{"x", onnx.Float, nil}}, outs: []tensor{{"y", onnx.Float, nil}}, wantErr: "is a scalar"},
		{name: "labels need an output", ins: classifierIO.ins, outs: []tensor{{"a", onnx.Float, []int64{-1}}, {"b", onnx.Float, []int64{-1}}}, opts: GenerateOptions{LabelsFile: "l.txt"}, wantErr: "say which one"},
		{name: "queue delay without batching", ins: []tensor{{"x", onnx.Float, []int64{2}}}, outs: []tensor{{"y", onnx.Float, []int64{2}}}, opts: GenerateOptions{MaxQueueDelayMicros: 5}, wantErr: "need max_batch_size > 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sig := signatureOf(t, tc.ins, tc.outs)
			opts := tc.opts
			opts.Name = "m"
			c, err := Generate(sig, opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Generate = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Generate = %v", err)
			}
			if c.GetMaxBatchSize() != tc.wantMBS {
				t.Errorf("max_batch_size = %d, want %d", c.GetMaxBatchSize(), tc.wantMBS)
			}
			if got := c.GetInput()[0].GetDims(); dimsString(got) != dimsString(tc.wantDims) {
				t.Errorf("input[0].dims = %v, want %v", got, tc.wantDims)
			}
			if got := c.GetInput()[0].GetReshape() != nil; got != tc.reshaped {
				t.Errorf("input[0] has reshape = %v, want %v", got, tc.reshaped)
			}
			if got := c.GetDynamicBatching() != nil; got != tc.dynBatch {
				t.Errorf("dynamic_batching set = %v, want %v", got, tc.dynBatch)
			}
		})
	}
}

func TestGenerateOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts GenerateOptions
		want string
	}{
		{GenerateOptions{}, "name is required"},
		{GenerateOptions{Name: "m", Platform: "ensemble"}, "cannot be generated"},
		{GenerateOptions{Name: "m", InstanceKind: "tpu"}, "instance kind"},
		{GenerateOptions{Name: "m", Warmup: "ones"}, "warmup"},
		{GenerateOptions{Name: "m", AllVersions: true, LatestVersions: 2}, "one version policy"},
		{GenerateOptions{Name: "m", TensorRTPrecision: "FP16"}, "need the TensorRT accelerator"},
		{GenerateOptions{Name: "m", TensorRTAccelerator: true, TensorRTPrecision: "FP8"}, "precision"},
		{GenerateOptions{Name: "m", MaxBatchSize: -2}, "max batch size"},
	} {
		if err := tc.opts.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v.Validate() = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
}

func TestAutofillKeepsGivenIO(t *testing.T) {
	sig := signatureOf(t, classifierIO.ins, classifierIO.outs)
	c := &configpb.ModelConfig{Input: []*configpb.ModelInput{{Name: "images", Format: configpb.ModelInput_FORMAT_NCHW}}}
	if err := Autofill(c, "m", sig, AutofillOptions{DefaultMaxBatchSize: 8}); err != nil {
		t.Fatal(err)
	}
	if got := c.GetInput()[0]; got.GetFormat() != configpb.ModelInput_FORMAT_NCHW || dimsString(got.GetDims()) != "[3,224,224]" || got.GetDataType() != configpb.DataType_TYPE_FP32 {
		t.Errorf("Autofill completed input to %v, want format kept and dims [3,224,224] TYPE_FP32", got)
	}
	if len(c.GetOutput()) != 1 || c.GetMaxBatchSize() != 8 || c.GetDynamicBatching() == nil {
		t.Errorf("Autofill = %s, want one output, max_batch_size 8 and dynamic batching", Print(c))
	}
}
