package calibrate

import (
	"syscall"
	"unsafe"
)

// schedIdle is Linux's SCHED_IDLE scheduling policy.
const schedIdle = 5

// lowerPriority puts the calling thread in the SCHED_IDLE policy: it runs
// when no other thread of its group wants the CPU, and a waking thread of
// normal priority preempts it at once. Lowering one's own priority needs
// no privilege; where it fails the thread keeps its priority.
func lowerPriority() {
	var param struct{ priority int32 }
	syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(syscall.Gettid()), schedIdle, uintptr(unsafe.Pointer(&param)))
}
