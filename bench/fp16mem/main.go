// Command fp16mem measures the peak resident memory of the FP16 rewrite of
// a model file (onnx.Load, convert.ToFP16, Save) over the process's
// baseline, against the file size, in one process per run so the kernel's
// high-water mark (VmHWM) belongs to that work alone (see bench/fp16.sh):
//
//	fp16mem -gen 100 -o /tmp/wide.onnx   write a ~100 MB model
//	fp16mem FILE                        convert FILE to FILE.fp16
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/convert"
	"github.com/kiln-ml/kiln/internal/testmodels"
	"github.com/kiln-ml/kiln/onnx"
)

func main() {
	gen := flag.Int("gen", 0, "generate a model with this many MB of weights")
	out := flag.String("o", "", "output path for -gen")
	flag.Parse()
	if err := run(*gen, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "fp16mem:", err)
		os.Exit(1)
	}
}

func run(gen int, out string, args []string) error {
	if gen > 0 {
		return (&onnx.Model{Proto: testmodels.Wide(gen, 7)}).Save(out)
	}
	if len(args) != 1 {
		return fmt.Errorf("want one model file")
	}
	path := args[0]
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	debug.FreeOSMemory()
	base := status("VmRSS")
	start := time.Now()
	m, err := onnx.Load(path)
	if err != nil {
		return err
	}
	h, rep, err := convert.ToFP16(m, convert.FP16Options{KeepIOTypes: true})
	if err != nil {
		return err
	}
	if err := h.Save(path + ".fp16"); err != nil {
		return err
	}
	dur := time.Since(start)
	peak := status("VmHWM")
	runtime.KeepAlive(m)
	runtime.KeepAlive(h)
	ost, err := os.Stat(path + ".fp16")
	if err != nil {
		return err
	}
	os.Remove(path + ".fp16")
	fmt.Printf("fp16 file=%dMB out=%dMB peak_over_base=%dMB ratio=%.2f time=%s converted=%d\n", st.Size()>>20, ost.Size()>>20,
		(peak-base)>>20, float64(peak-base)/float64(st.Size()), dur.Round(time.Millisecond), rep.ConvertedInitializers)
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
