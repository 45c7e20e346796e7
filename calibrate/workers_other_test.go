//go:build !linux

package calibrate

import "time"

func threadPolicy() int { return -1 }

func processCPU() time.Duration { return 0 }
