package calibrate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/dataset"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"github.com/kiln-ml/kiln/ort"
)

// memSource serves generated samples from memory, so benchmarks time the
// model and the statistics, not image decoding.
type memSource struct {
	input string
	dims  []int64
	seed  uint64
	n     int
}

func (s memSource) Len() int { return s.n }

func (s memSource) Sample(_ context.Context, i int) (dataset.Sample, error) {
	rng := rand.New(rand.NewPCG(s.seed, uint64(i)))
	per := 1
	for _, d := range s.dims {
		per *= int(d)
	}
	v := make([]float32, per)
	base := float32(rng.NormFloat64())
	for j := range v {
		v[j] = base + float32(rng.NormFloat64())*0.5
	}
	t, err := onnx.NewTensor(s.input, s.dims, v)
	return dataset.Sample{ID: fmt.Sprintf("mem#%d", i), Tensors: map[string]*onnx.Tensor{s.input: t}, Label: -1}, err
}

// benchModel is a model and the two sample counts the calibration
// benchmark runs it with.
type benchModel struct {
	name   string
	proto  *onnxpb.ModelProto
	dims   []int64 // one sample's input shape
	n1, n2 int
}

var benchModels = []benchModel{
	// 16 channels at 32x32: about as much compute per activation as it
	// costs to read the activation once, the worst case for calibration.
	{"classifier", testmodels.Classifier(1), []int64{3, 32, 32}, 256, 1024},
	// ResNet-18 proportions: most of the work is in convolutions.
	{"resnetish", testmodels.ResNetish(64, 1), []int64{3, testmodels.ResNetishSize, testmodels.ResNetishSize}, 64, 256},
}

const benchBatch = 32

// benchSession sizes ONNX Runtime's pool to the CPUs for every job: left to
// itself, ONNX Runtime counts physical cores, which on a 2-vCPU VM is one.
var benchSession = ort.SessionOptions{IntraOpThreads: runtime.NumCPU()}

// batchesOf makes the batches of src once, so that timing covers the model
// and the statistics, and inference and calibration read the same memory.
func batchesOf(b testing.TB, src memSource, sig []onnx.ValueInfo) []*dataset.Batch {
	var out []*dataset.Batch
	for bt, err := range dataset.Batches(context.Background(), src, nil, dataset.BatchOptions{Size: benchBatch, Inputs: sig}) {
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, bt)
	}
	return out
}

func replay(batches []*dataset.Batch) iter.Seq2[*dataset.Batch, error] {
	return func(yield func(*dataset.Batch, error) bool) {
		for _, bt := range batches {
			if !yield(bt, nil) {
				return
			}
		}
	}
}

// BenchmarkCalibrate times, side by side in one loop, three jobs over the
// same N samples: plain ONNX Runtime inference (the baseline: open a
// session, run every batch, close), the augmented model alone (the same
// with every observed tensor fetched, no statistics) and calibration
// (Collect plus computing entropy ranges). Each job starts from a heap
// returned to the OS (debug.FreeOSMemory, outside the timing), as a fresh
// process would, and jobs alternate so that noise from other processes hits
// all alike. It runs a model where activations dominate (classifier) and
// one where convolutions do (resnetish), each with two sample counts:
//
//   - calib/infer@N is the overhead of calibrating N samples, fixed costs
//     (opening the augmented session, first runs into fresh memory)
//     included;
//   - calib/infer-marginal is (calib(n2)-calib(n1)) / (infer(n2)-infer(n1)),
//     the overhead per additional sample, which large N tends to;
//   - peak-heap-MiB@N (Go heap in use after each batch) and peak-rss-MiB@N
//     (the kernel's high-water mark of resident memory, reset before the
//     job) must not grow with N.
func BenchmarkCalibrate(b *testing.B) {
	initORT(b)
	for _, bm := range benchModels {
		b.Run(bm.name, func(b *testing.B) {
			m := &onnx.Model{Proto: bm.proto}
			sig := m.Inputs()
			data, err := m.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			names, err := Observed(m)
			if err != nil {
				b.Fatal(err)
			}
			// The augmented model as Collect runs it, without the
			// tensors it derives from others.
			aug, err := Augment(m, derive(m, names).fetched(names))
			if err != nil {
				b.Fatal(err)
			}
			adata, err := aug.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			all := batchesOf(b, memSource{input: "images", dims: bm.dims, seed: 1, n: bm.n2}, sig)
			type acc struct {
				infer, fetch, calib time.Duration
				heap, rss           uint64
			}
			var by [2]acc
			timed := func(d *time.Duration, f func() error) {
				debug.FreeOSMemory()
				t0 := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				*d += time.Since(t0)
			}
			for b.Loop() {
				for i, n := range []int{bm.n1, bm.n2} {
					a := &by[i]
					batches := all[:n/benchBatch]
					timed(&a.infer, func() error { return inferJob(data, batches) })
					timed(&a.fetch, func() error { return inferJob(adata, batches) })
					debug.FreeOSMemory()
					resetPeakRSS()
					timed(&a.calib, func() error {
						st, err := Collect(context.Background(), m, replay(batches), CollectOptions{
							Session: benchSession,
							Progress: func(int) {
								var ms runtime.MemStats
								runtime.ReadMemStats(&ms)
								a.heap = max(a.heap, ms.HeapInuse)
							},
						})
						if err != nil {
							return err
						}
						_, err = st.Ranges(Entropy, MethodOptions{})
						return err
					})
					a.rss = max(a.rss, peakRSS())
				}
			}
			for i, n := range []int{bm.n1, bm.n2} {
				a := by[i]
				per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N*n) }
				b.ReportMetric(per(a.infer), fmt.Sprintf("infer-µs/sample@%d", n))
				b.ReportMetric(per(a.fetch), fmt.Sprintf("fetch-µs/sample@%d", n))
				b.ReportMetric(per(a.calib), fmt.Sprintf("calib-µs/sample@%d", n))
				b.ReportMetric(float64(a.fetch)/float64(a.infer), fmt.Sprintf("fetch/infer@%d", n))
				b.ReportMetric(float64(a.calib)/float64(a.infer), fmt.Sprintf("calib/infer@%d", n))
				b.ReportMetric(float64(a.heap)/(1<<20), fmt.Sprintf("peak-heap-MiB@%d", n))
				if a.rss > 0 {
					b.ReportMetric(float64(a.rss)/(1<<20), fmt.Sprintf("peak-rss-MiB@%d", n))
				}
			}
			b.ReportMetric(float64(by[1].fetch-by[0].fetch)/float64(by[1].infer-by[0].infer), "fetch/infer-marginal")
			b.ReportMetric(float64(by[1].calib-by[0].calib)/float64(by[1].infer-by[0].infer), "calib/infer-marginal")
			b.ReportMetric(0, "ns/op") // an iteration is six different jobs
		})
	}
}

// inferJob opens a session on model, runs every batch, handing each result
// back for the next run as a steady-state inference loop would, and closes
// the session.
func inferJob(model []byte, batches []*dataset.Batch) error {
	sess, err := ort.NewSessionFromBytes(model, benchSession)
	if err != nil {
		return err
	}
	defer sess.Close()
	return runAll(sess, batches)
}

// runAll runs every batch, handing each result back for the next run as a
// steady-state inference loop would.
func runAll(sess *ort.Session, batches []*dataset.Batch) error {
	var outs map[string]*onnx.Tensor
	for _, bt := range batches {
		var err error
		if outs, err = sess.RunReuse(context.Background(), bt.Tensors, nil, outs); err != nil {
			return err
		}
	}
	return nil
}

// resetPeakRSS resets the kernel's high-water mark of this process's
// resident memory (Linux; a no-op elsewhere).
func resetPeakRSS() { os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is the high-water mark of resident memory since the last reset,
// or 0 where the kernel does not say.
func peakRSS() uint64 {
	f, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(f))
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmHWM:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// BenchmarkAddBatch is the histogram update Collect makes per tensor, on a
// tensor of one batch of a 64-channel 28x28 activation.
func BenchmarkAddBatch(b *testing.B) {
	v := gaussian(benchBatch*64*28*28, 1, 1)
	h := NewHistogram()
	if err := h.Add(v); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		if err := h.Add(v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(v)), "ns/value")
}

// BenchmarkAddRelu is BenchmarkAddBatch for a tensor and the ReLU of it
// that Collect derives from it in the same passes.
func BenchmarkAddRelu(b *testing.B) {
	v := gaussian(benchBatch*64*28*28, 1, 1)
	rv := make([]float32, len(v))
	for i, x := range v {
		rv[i] = reluOf(x)
	}
	h, r := NewHistogram(), NewHistogram()
	if err := errors.Join(h.Add(v), r.Add(rv)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		if err := addRelu(h, r, v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(v)), "ns/value")
}
