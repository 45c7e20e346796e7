package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-ml/kiln/savedmodel"
	"github.com/kiln-ml/kiln/savedmodel/smtest"
)

// genSavedModel writes smtest.MatMulChain with 2048x2048 layers, as many
// as make about mb MB of variables, to dir.
func genSavedModel(dir string, mb int) error {
	const n = 2048
	layers := max(1, int((int64(mb)*1e6+n*n*2)/(n*n*4)))
	_, err := smtest.MatMulChain(dir, n, layers, 1)
	return err
}

// readTree reads every file under dir, the floor of an import: reading
// the same bytes.
func readTree(dir string) ([][]byte, error) {
	var all [][]byte
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		all = append(all, b)
		return err
	})
	return all, err
}

// treeSize is the size of the files under dir.
func treeSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			total += info.Size()
		}
		return err
	})
	return total, err
}

// importSavedModel is what `kiln import DIR -o OUT` does: open, convert
// and save, OUT removed afterwards. It prints the time of each step to
// stderr.
func importSavedModel(dir, out string) (*savedmodel.Conversion, error) {
	ctx := context.Background()
	t0 := time.Now()
	m, err := savedmodel.Open(ctx, dir, nil)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	c, err := savedmodel.Convert(ctx, m, savedmodel.ConvertOptions{})
	if err != nil {
		return nil, err
	}
	t2 := time.Now()
	err = c.Model.Save(out)
	os.Remove(out)
	t3 := time.Now()
	fmt.Fprintf(os.Stderr, "import: open %s, convert %s, save %s\n", t1.Sub(t0).Round(time.Millisecond),
		t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond))
	return c, err
}
