package calibrate

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadPolicy is the calling thread's scheduling policy.
func threadPolicy() int {
	p, _, _ := syscall.RawSyscall(syscall.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
	return int(p)
}

// processCPU is the CPU time the process has used, every thread, user and
// system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestLowerPriority(t *testing.T) {
	got := make(chan int)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		lowerPriority()
		got <- threadPolicy()
	}()
	if p := <-got; p != schedIdle {
		t.Fatalf("scheduling policy after lowerPriority: %d, want SCHED_IDLE (%d)", p, schedIdle)
	}
}
