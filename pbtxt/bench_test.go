package pbtxt

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkLintRepository lints a repository of 1,000 ONNX models (config,
// version directory, model file, labels) including the model-file checks,
// alternating with a baseline that only reads the same files, so the cost
// of the checks themselves shows as the ratio of the two (lint/read).
func BenchmarkLintRepository(b *testing.B) {
	repo := b.TempDir()
	src := filepath.Join(b.TempDir(), "model.onnx")
	writeONNX(b, src, classifierIO.ins, classifierIO.outs)
	sig, err := LoadSignature(src)
	if err != nil {
		b.Fatal(err)
	}
	const models = 1000
	for i := 0; i < models; i++ {
		c, err := Generate(sig, GenerateOptions{Name: fmt.Sprintf("model_%04d", i), LabelsFile: "labels.txt", InstanceKind: "cpu"})
		if err != nil {
			b.Fatal(err)
		}
		dir := filepath.Join(repo, c.Name)
		if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
			b.Fatal(err)
		}
		writeONNX(b, filepath.Join(dir, "1", "model.onnx"), classifierIO.ins, classifierIO.outs)
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), Print(c), 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "labels.txt"), []byte("cat\ndog\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	lint := func() {
		ps, err := LintRepository(repo, LintOptions{})
		if err != nil || len(ps) != 0 {
			b.Fatalf("LintRepository = %d problems, %v", len(ps), err)
		}
	}
	read := func() {
		entries, err := os.ReadDir(repo)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range entries {
			dir := filepath.Join(repo, e.Name())
			if _, err := os.ReadDir(filepath.Join(dir, "1")); err != nil {
				b.Fatal(err)
			}
			for _, f := range []string{ConfigFile, filepath.Join("1", "model.onnx")} {
				if _, err := os.ReadFile(filepath.Join(dir, f)); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "labels.txt")); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Lint and its baseline alternate in one loop, so that noise from
	// other processes hits both alike; the ratio is the result.
	var linted, readT time.Duration
	for b.Loop() {
		t0 := time.Now()
		lint()
		t1 := time.Now()
		read()
		linted, readT = linted+t1.Sub(t0), readT+time.Since(t1)
	}
	b.ReportMetric(float64(linted)/float64(readT), "lint/read")
	b.ReportMetric(float64(linted.Microseconds())/1e3/float64(b.N), "lint-ms")
	b.ReportMetric(float64(readT.Microseconds())/1e3/float64(b.N), "read-ms")
}
