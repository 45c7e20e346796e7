package convert

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
)

// maxWiden is how many times an fp16 variant that misses its thresholds is
// rebuilt with more of the graph around the failing outputs kept in fp32;
// maxKeptShare bounds the share of the graph's nodes kept so: beyond it
// the model is not an fp16 model any more, and the variant fails instead
// of carrying a false label.
const (
	maxWiden     = 4
	maxKeptShare = 0.25
)

// checkedONNX builds an ONNX variant and checks it. An fp16 variant that
// misses a threshold is rebuilt with the nodes nearest the failing outputs
// kept in fp32, widening the kept region (4, 8, 16, 32 nodes back from
// each failing output) until it passes or maxWiden rebuilds are spent — as
// the accuracy-driven mode of tools like TensorRT Model Optimizer's
// AutoCast does. Only when the user gave no block list of their own.
func (b *builder) checkedONNX(ctx context.Context, v manifest.Variant, model string) (*artifact, error) {
	for attempt := 0; ; attempt++ {
		art, err := b.onnxArtifact(ctx, v)
		if err != nil {
			return nil, err
		}
		checks, note, err := b.checkVariant(ctx, v, model, art.file)
		var ce *CheckError
		widen := errors.As(err, &ce) && ce.Err == nil && v.Precision == manifest.FP16 && attempt < maxWiden &&
			b.cfg.FP16.OpBlockList == nil && len(b.cfg.FP16.NodeBlockList) == 0
		if err != nil && widen {
			extra := b.fp16Extra
			added := b.widenFP16(ce, 4<<attempt)
			if total := len(b.model.Graph().GetNode()); float64(len(b.fp16Extra)+b.fp16Kept) > maxKeptShare*float64(total) {
				b.fp16Extra = extra
				return nil, fmt.Errorf("%w; keeping more of the graph in fp32 would not make it pass before a quarter of its %d nodes were fp32 (then it is no fp16 model)", err, total)
			}
			if added > 0 {
				b.log.Info("fp16 variant missed its thresholds; keeping more nodes in fp32", "variant", v.ID(), "added", added, "kept", len(b.fp16Extra), "err", err)
				b.fp16 = saved{} // rebuild
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		art.checks = checks
		if n := len(b.fp16Extra); n > 0 && v.Precision == manifest.FP16 {
			note = strings.TrimPrefix(note+fmt.Sprintf("; %d nodes near the outputs kept in fp32 to meet the thresholds", n), "; ")
		}
		if note != "" {
			art.note = strings.TrimPrefix(art.note+"; "+note, "; ")
		}
		return art, nil
	}
}

// widenFP16 adds to the fp16 block list the named nodes within depth
// nodes of the graph's inputs (where casting the input to fp16 loses its
// precision: pixel values of 0..255 keep 11 bits) and upstream of each
// output that failed, and returns how many it added.
func (b *builder) widenFP16(ce *CheckError, depth int) int {
	g := b.model.Graph()
	ix := onnx.NewIndex(g)
	producer := ix.Producer
	kept := map[string]bool{}
	for _, n := range b.fp16Extra {
		kept[n] = true
	}
	added := 0
	keep := func(n *onnxpb.NodeProto) {
		if name := n.GetName(); name != "" && !kept[name] {
			kept[name] = true
			b.fp16Extra = append(b.fp16Extra, name)
			added++
		}
	}
	var frontier []string
	for _, in := range b.model.Inputs() {
		frontier = append(frontier, in.Name)
	}
	seenIn := map[string]bool{}
	for d := 0; d < depth/4 && len(frontier) > 0; d++ {
		var next []string
		for _, t := range frontier {
			if seenIn[t] {
				continue
			}
			seenIn[t] = true
			for _, n := range ix.Consumers[t] {
				keep(n)
				next = append(next, n.GetOutput()...)
			}
		}
		frontier = next
	}
	for _, f := range ce.Failures {
		frontier := []string{f.Output}
		seen := map[string]bool{}
		for d := 0; d < depth && len(frontier) > 0; d++ {
			var next []string
			for _, t := range frontier {
				n := producer[t]
				if n == nil || seen[t] {
					continue
				}
				seen[t] = true
				keep(n)
				next = append(next, n.GetInput()...)
			}
			frontier = next
		}
	}
	return added
}
