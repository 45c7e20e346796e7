//go:build !linux

package calibrate

func threadPolicy() int { return -1 }
