package pack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/manifest"
)

// BenchmarkPushImage pushes a repository of weight-like files as an image
// to distribution's registry (a separate process, a fresh one per push so
// that no blob is already there) with the kiln binary, and the same files
// as one tar layer with `crane append` (go-containerregistry's own CLI),
// alternating, and reports the ratio of their wall times and kiln's peak
// RSS. Sizes in GiB come from KILN_BENCH_PACK_GIB (default "1"); crane
// runs for sizes of 1 GiB and less. Everything is written under the test's
// temporary directory and removed afterwards.
//
//	make servers crane
//	KILN_BENCH_PACK_GIB=1,4 go test -run '^$' -bench PushImage -benchtime 1x ./pack/
func BenchmarkPushImage(b *testing.B) {
	crane, err := filepath.Abs(filepath.Join("..", ".bin", "crane"))
	if err != nil || distributionBinary() == "" {
		b.Skip("needs distribution's registry (make servers)")
	}
	if _, err := os.Stat(crane); err != nil {
		b.Skip("needs crane (make crane)")
	}
	kiln := filepath.Join(b.TempDir(), "kiln")
	if out, err := exec.Command("go", "build", "-o", kiln, "../cmd/kiln").CombinedOutput(); err != nil {
		b.Fatalf("building kiln: %v\n%s", err, out)
	}
	sizes := os.Getenv("KILN_BENCH_PACK_GIB")
	if sizes == "" {
		sizes = "1"
	}
	for _, s := range strings.Split(sizes, ",") {
		gib, err := strconv.Atoi(s)
		if err != nil || gib < 1 {
			b.Fatalf("KILN_BENCH_PACK_GIB: %q is not a whole number of GiB", s)
		}
		b.Run(s+"GiB", func(b *testing.B) { benchPush(b, kiln, crane, gib) })
	}
}

func benchPush(b *testing.B, kiln, crane string, gib int) {
	repo := filepath.Join(b.TempDir(), "repo")
	writeRepo(b, repo, 8*gib, 128<<20)
	rounds, layer := 1, ""
	if gib <= 1 {
		rounds, layer = 3, craneLayer(b, repo)
	}
	var kilnTime, craneTime time.Duration
	var kilnRSS, craneRSS int64
	for i := range rounds {
		runKiln := func() {
			host := distributionRegistry(b, b.TempDir())
			d, rss := timeRun(b, kiln, "pack", repo, "--to", "image:"+host+"/kiln/bench:1", "--base", "scratch", "--insecure")
			kilnTime, kilnRSS = kilnTime+d, max(kilnRSS, rss)
			b.Logf("round %d: kiln pack %v, peak RSS %d MiB", i, d.Round(time.Millisecond), rss>>20)
		}
		runCrane := func() {
			host := distributionRegistry(b, b.TempDir())
			d, rss := timeRun(b, crane, "append", "--insecure", "-f", layer, "-t", host+"/crane/bench:1")
			craneTime, craneRSS = craneTime+d, max(craneRSS, rss)
			b.Logf("round %d: crane append %v, peak RSS %d MiB", i, d.Round(time.Millisecond), rss>>20)
		}
		if layer == "" {
			runKiln()
		} else if i%2 == 0 {
			runKiln()
			runCrane()
		} else {
			runCrane()
			runKiln()
		}
	}
	b.ReportMetric(kilnTime.Seconds()/float64(rounds), "kiln-s/push")
	b.ReportMetric(float64(kilnRSS)/(1<<20), "kiln-peak-MiB")
	if layer != "" {
		b.ReportMetric(craneTime.Seconds()/float64(rounds), "crane-s/push")
		b.ReportMetric(float64(craneRSS)/(1<<20), "crane-peak-MiB")
		b.ReportMetric(kilnTime.Seconds()/craneTime.Seconds(), "kiln/crane")
	}
}

// craneLayer writes the repository as the tar kiln's layer holds, for
// crane to compress and push.
func craneLayer(b *testing.B, repo string) string {
	man, err := manifest.Read(repo)
	if err != nil {
		b.Fatal(err)
	}
	t, err := readTree(repo, man)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "layer.tar")
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := t.writeTar(f, strings.TrimPrefix(ModelsDir, "/")); err != nil {
		b.Fatal(err)
	}
	return file
}

// timeRun runs a command and returns its wall time and peak RSS in bytes.
func timeRun(b *testing.B, name string, args ...string) (time.Duration, int64) {
	cmd := exec.Command(name, args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		b.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		b.Fatal(fmt.Sprintf("%s: no rusage on this system", name))
	}
	return d, ru.Maxrss << 10 // KiB on Linux
}
