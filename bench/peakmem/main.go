// Command peakmem measures the peak resident memory of one operation on a
// model file, for BENCHMARKS.md. Each mode runs in its own process (see
// bench/peakmem.sh) so the kernel's high-water mark (VmHWM) belongs to that
// operation alone:
//
//	peakmem -gen 100 -o /tmp/wide.onnx   write a ~100 MB model
//	peakmem -mode read FILE              os.ReadFile (baseline)
//	peakmem -mode load FILE              onnx.Load
//	peakmem -mode save FILE              onnx.Load then Save to FILE.out
//	peakmem -mode fp16 FILE              onnx.Load, convert.ToFP16, Save to FILE.out
//
// and, for SavedModel import (see bench/importmem.sh):
//
//	peakmem -savedmodel 100 -o DIR       write a SavedModel with ~100 MB of variables (smtest.MatMulChain)
//	peakmem -mode read DIR               read every file under DIR (baseline)
//	peakmem -mode import DIR             savedmodel.Open, Convert, Save to DIR.onnx (what kiln import does)
//
// and, for calibration against plain inference (see bench/calibmem.sh),
// with ONNX Runtime from $KILN_ORT_LIB:
//
//	peakmem -large 256 -samples 8 -o DIR   write testmodels.LargeActivations(256) and 8 samples
//	peakmem -mode infer -data D MODEL      plain inference of the samples, batch 1
//	peakmem -mode calibrate -data D MODEL  calibrate.Run, batch 1 (-validation -1: none)
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

func main() {
	gen := flag.Int("gen", 0, "generate a model with this many MB of weights")
	out := flag.String("o", "", "output path for -gen")
	mode := flag.String("mode", "", "read, load, save, fp16, import, infer or calibrate")
	smMB := flag.Int("savedmodel", 0, "generate a SavedModel with this many MB of variables into -o DIR")
	large := flag.Int("large", 0, "generate testmodels.LargeActivations with this many branches into -o DIR")
	var co calibOptions
	flag.StringVar(&co.data, "data", "", "dataset for infer and calibrate")
	flag.IntVar(&co.samples, "samples", 2, "samples: written with -large, drawn by infer and calibrate (0: all)")
	flag.IntVar(&co.validation, "validation", 0, "calibrate.Config.Validation")
	flag.Int64Var(&co.budget, "budget", 0, "calibrate.Config.MemoryBudget in bytes (0: none)")
	flag.IntVar(&co.threads, "threads", 0, "ONNX Runtime intra-op threads (0: one per CPU)")
	flag.BoolVar(&co.noArena, "noarena", false, "infer: turn off ONNX Runtime's CPU memory arena (ort.SessionOptions.NoCPUArena)")
	flag.StringVar(&co.preprocess, "preprocess", "", "infer and calibrate: how images are read (dataset.ParsePreprocess)")
	flag.Parse()
	if *large > 0 || *smMB > 0 {
		var err error
		if *smMB > 0 {
			err = genSavedModel(*out, *smMB)
		} else {
			err = genLarge(*out, *large, co.samples)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "peakmem:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*gen, *out, *mode, co, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "peakmem:", err)
		os.Exit(1)
	}
}

func run(gen int, out, mode string, co calibOptions, args []string) error {
	if gen > 0 {
		return (&onnx.Model{Proto: testmodels.Wide(gen, 7)}).Save(out)
	}
	if len(args) != 1 {
		return fmt.Errorf("want one model file")
	}
	path := args[0]
	size, err := treeSize(path) // a file's own size
	if err != nil {
		return err
	}
	if mode == "infer" || mode == "calibrate" {
		if err := initORT(); err != nil {
			return err
		}
		if co.threads == 0 {
			co.threads = runtime.NumCPU()
		}
	}
	debug.FreeOSMemory()
	base := status("VmRSS")
	start := time.Now()
	var keep any
	switch mode {
	case "read":
		keep, err = readTree(path)
	case "import":
		keep, err = importSavedModel(path, path+".onnx")
	case "load":
		keep, err = onnx.Load(path)
	case "save":
		var m *onnx.Model
		if m, err = onnx.Load(path); err == nil {
			err = m.Save(path + ".out")
			os.Remove(path + ".out")
		}
		keep = m
	case "fp16":
		var m *onnx.Model
		if m, err = onnx.Load(path); err == nil {
			var h *onnx.Model
			if h, _, err = fp16.Convert(m, fp16.Options{KeepIOTypes: true}); err == nil {
				err = h.Save(path + ".out")
				os.Remove(path + ".out")
			}
		}
		keep = m
	case "infer":
		keep, err = infer(context.Background(), path, co)
	case "calibrate":
		keep, err = calib(context.Background(), path, co)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		return err
	}
	dur := time.Since(start)
	peak := status("VmHWM")
	runtime.KeepAlive(keep)
	if mode == "infer" || mode == "calibrate" {
		fmt.Printf("%s noarena=%v samples=%d validation=%d budget=%d peak=%dMiB peak_over_base=%dMiB time=%s\n", mode, co.noArena, co.samples, co.validation,
			co.budget, peak>>20, (peak-base)>>20, dur.Round(time.Millisecond))
		return nil
	}
	fmt.Printf("%s file=%dMB peak=%dMB peak_over_base=%dMB ratio=%.2f time=%s\n", mode, size>>20, peak>>20,
		(peak-base)>>20, float64(peak-base)/float64(size), dur.Round(time.Millisecond))
	return nil
}

// status reads a /proc/self/status field in bytes.
func status(key string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
