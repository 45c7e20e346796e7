package cmd

import (
	"runtime"
	"testing"
)

func TestResolveThreads(t *testing.T) {
	if got := resolveThreads(0); got != runtime.NumCPU() {
		t.Errorf("resolveThreads(0) = %d, want runtime.NumCPU() = %d", got, runtime.NumCPU())
	}
	if got := resolveThreads(3); got != 3 {
		t.Errorf("resolveThreads(3) = %d, want 3", got)
	}
	if defaultMemoryBudget() <= 0 {
		t.Error("no default memory budget from /proc/meminfo")
	}
}
