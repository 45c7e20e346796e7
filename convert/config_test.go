package convert

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/convert/fp16"
	"github.com/kiln-ml/kiln/internal/trtexec"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Source: "m.onnx", Repo: "repo"}
	six := 6
	tests := []struct {
		name string
		edit func(c *Config)
		want string // "" for valid
	}{
		{"minimal", func(c *Config) {}, ""},
		{"every setting", func(c *Config) {
			c.Name = "resnet50"
			c.Int8.Mode = trtexec.Int8Cache
			c.TRT = TRTConfig{WorkspaceBytes: 1 << 30, HardwareCompat: trtexec.HardwareCompatAmperePlus,
				Target: &trtexec.Target{ComputeCapability: "sm_86"}}
		}, ""},
		{"no source", func(c *Config) { c.Source = "" }, "no source model given"},
		{"no repo", func(c *Config) { c.Repo = "" }, "no model repository given"},
		{"bad name", func(c *Config) { c.Name = "Res/Net" }, "model name"},
		{"int8 mode random", func(c *Config) { c.Int8.Mode = trtexec.Int8Random }, `unknown int8 mode "random"`},
		{"negative workspace", func(c *Config) { c.TRT.WorkspaceBytes = -1 }, "workspace of -1 bytes is negative"},
		{"optimization level", func(c *Config) { c.TRT.OptimizationLevel = &six }, "level 6 out of range 0-5"},
		{"hardware compat", func(c *Config) { c.TRT.HardwareCompat = "turing+" }, `unknown hardware compatibility level "turing+"`},
		{"target", func(c *Config) { c.TRT.Target = &trtexec.Target{ComputeCapability: "ampere"} }, `target: compute capability "ampere"`},
		{"negative timeout", func(c *Config) { c.TRT.Timeout = -1 }, "timeout -1ns is negative"},
		{"fp16 bounds", func(c *Config) { c.FP16 = fp16.Options{MaxFinite: 1e6} }, "invalid fp16 options"},
	}
	for _, tt := range tests {
		c := ok
		tt.edit(&c)
		err := c.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("Config(%s).Validate() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestWorkspaceMiB(t *testing.T) {
	for _, tt := range []struct {
		bytes int64
		want  int
	}{{0, 0}, {1, 1}, {1 << 20, 1}, {1<<20 + 1, 2}, {1024 << 20, 1024}} {
		if got := (TRTConfig{WorkspaceBytes: tt.bytes}).workspaceMiB(); got != tt.want {
			t.Errorf("TRTConfig{WorkspaceBytes: %d}.workspaceMiB() = %d, want %d", tt.bytes, got, tt.want)
		}
	}
}
