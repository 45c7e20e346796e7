package calibrate

import "github.com/kiln-ml/kiln/onnx"

// largeRun is the size of one run's activations from which Collect keeps a
// single set alive: ONNX Runtime waits for the histograms to hand a set
// back before it runs the next, instead of running one run ahead into a
// second set. Below it the overlap is worth the second set; above it the
// memory of a second set (gigabytes for high-resolution models) is not.
const largeRun = 256 << 20

// tensorBytes is each tensor's memory per sample in a run of n samples.
func tensorBytes(outs map[string]*onnx.Tensor, n int) map[string]int {
	per := make(map[string]int, len(outs))
	for name, t := range outs {
		per[name] = outputBytes(map[string]*onnx.Tensor{name: t}) / max(1, n)
	}
	return per
}

// fetchGroups splits names, in order, into groups whose tensors take at
// most budget bytes in a run of samples samples (per: bytes per sample, as
// the first run measured), so that a run that alone would exceed the
// memory budget fetches one group at a time, each a run of its own over the
// same samples. A tensor over the budget by itself is a group of its own.
// A budget of 0, or one that the whole run fits, gives one group.
func fetchGroups(names []string, per map[string]int, samples int, budget int64) [][]string {
	total := int64(0)
	for _, n := range names {
		total += int64(per[n]) * int64(samples)
	}
	if budget <= 0 || total <= budget {
		return [][]string{names}
	}
	var groups [][]string
	var cur []string
	size := int64(0)
	for _, n := range names {
		b := int64(per[n]) * int64(samples)
		if len(cur) > 0 && size+b > budget {
			groups = append(groups, cur)
			cur, size = nil, 0
		}
		cur = append(cur, n)
		size += b
	}
	return append(groups, cur)
}

// switchSessions leaves the first run's session, which fetched every
// tensor, for the runs after it: one session without the input-free
// tensors, or one per fetch group when a run would exceed the memory
// budget (see fetchGroups).
func (c *collector) switchSessions() error {
	c.switched = true
	samples := 1
	if c.sizer.split {
		samples = c.sizer.chunk
	}
	groups := fetchGroups(c.rest, c.perSample, samples, c.opts.MemoryBudget)
	if len(groups) == 1 && len(c.rest) == len(c.fetch) {
		return nil // the first session fetches what later runs do
	}
	c.sess.Close()
	c.sess = nil
	if len(groups) == 1 {
		var err error
		c.sess, err = openAugmented(c.m, c.rest, c.opts.Session)
		return err
	}
	for _, g := range groups {
		s, err := openAugmented(c.m, g, c.opts.Session)
		if err != nil {
			return err
		}
		c.parts = append(c.parts, s)
	}
	c.groups = groups
	return nil
}
