package calibrate

import (
	"syscall"
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
