//go:build !linux

package calibrate

// lowerPriority does nothing outside Linux: the workers keep their
// priority.
func lowerPriority() {}
