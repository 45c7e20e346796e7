package calibrate

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/internal/atomicfile"
	"github.com/kiln-ml/kiln/manifest"
)

// EntropyCalibration2 is the cache algorithm of IInt8EntropyCalibrator2, the
// calibrator trtexec installs for --calib; trtexec rejects any other.
const EntropyCalibration2 = "EntropyCalibration2"

// Cache is a TensorRT INT8 calibration cache: the text file trtexec --calib
// and TensorRT's calibrators read and write (reference/formats.md §2.1):
//
//	TRT-<version>-<algorithm>
//	<tensor name>: <8 hex digits of the float32 bits of the scale>
//
// The dynamic range TensorRT applies is ±127*scale.
type Cache struct {
	// Version is the number in the header: TensorRT's version number
	// (manifest.TRTVersion.Number).
	Version int
	// Algorithm is the calibrator, e.g. EntropyCalibration2 or MinMaxCalibration.
	Algorithm string
	// Scales maps tensor names to scales.
	Scales map[string]float32
	// Names lists the tensors in file order (ParseCache) or sorted (NewCache).
	Names []string
}

// NewCache builds an EntropyCalibration2 cache for TensorRT release v.
func NewCache(v manifest.TRTVersion, scales map[string]float32) Cache {
	c := Cache{Version: v.Number(), Algorithm: EntropyCalibration2, Scales: make(map[string]float32, len(scales))}
	for name, s := range scales {
		c.Scales[name] = s
		c.Names = append(c.Names, name)
	}
	sort.Strings(c.Names)
	return c
}

// headerRelease names the release a cache header's number stands for
// ("8.6.0"), or the number itself when it is no TensorRT version number.
func headerRelease(number int) string {
	if v, err := manifest.TRTVersionFromNumber(strconv.Itoa(number)); err == nil {
		return v.String()
	}
	return strconv.Itoa(number)
}

// Amax is the dynamic range TensorRT derives from a tensor's scale, scale*127
// in float32 as ONNX Runtime's reader computes it.
func (c Cache) Amax(name string) (float32, bool) {
	s, ok := c.Scales[name]
	return s * 127, ok
}

// ParseCache parses a TensorRT calibration cache. It accepts what TensorRT
// writes and what trtexec reads: the header TRT-<digits>-<algorithm>, then one
// "<name>: <8 hex digits>" line per tensor. Names may contain spaces, '*',
// brackets, '/' and ':', so a line is split at its last ": ". Lines may end in
// "\r\n"; empty lines are skipped. Errors name the line.
func ParseCache(data []byte) (Cache, error) {
	var c Cache
	first := map[string]int{}
	header := true
	for ln := 1; len(data) > 0; ln++ {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if header {
			if err := c.parseHeader(string(line)); err != nil {
				return Cache{}, fmt.Errorf("line %d: %w", ln, err)
			}
			header = false
			continue
		}
		if len(line) == 0 {
			continue
		}
		name, scale, err := parseCacheLine(string(line))
		if err != nil {
			return Cache{}, fmt.Errorf("line %d: %w", ln, err)
		}
		if at, dup := first[name]; dup {
			return Cache{}, fmt.Errorf("line %d: tensor %q is already on line %d", ln, name, at)
		}
		first[name] = ln
		c.Scales[name] = scale
		c.Names = append(c.Names, name)
	}
	if header {
		return Cache{}, fmt.Errorf("empty calibration cache: want a TRT-<version>-<algorithm> header")
	}
	return c, nil
}

func (c *Cache) parseHeader(line string) error {
	rest, ok := strings.CutPrefix(line, "TRT-")
	if !ok {
		return fmt.Errorf("header %q does not start with TRT-", truncate(line))
	}
	digits, algo, ok := strings.Cut(rest, "-")
	if !ok || digits == "" || len(digits) > 9 || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("header %q: want TRT-<version digits>-<algorithm>", truncate(line))
	}
	if !validAlgorithm(algo) {
		return fmt.Errorf("header %q: algorithm %q is not a calibrator name", truncate(line), truncate(algo))
	}
	c.Version, _ = strconv.Atoi(digits)
	c.Algorithm = algo
	c.Scales = map[string]float32{}
	return nil
}

func validAlgorithm(a string) bool {
	if a == "" {
		return false
	}
	for _, r := range a {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

func parseCacheLine(line string) (string, float32, error) {
	i := strings.LastIndex(line, ": ")
	if i < 0 {
		return "", 0, fmt.Errorf("%q has no \": \" between tensor name and scale", truncate(line))
	}
	name, hex := line[:i], line[i+2:]
	if name == "" {
		return "", 0, fmt.Errorf("%q has an empty tensor name", truncate(line))
	}
	if len(hex) != 8 || strings.Trim(hex, "0123456789abcdefABCDEF") != "" {
		return "", 0, fmt.Errorf("scale %q of tensor %q is not 8 hex digits", truncate(hex), truncate(name))
	}
	bits, _ := strconv.ParseUint(hex, 16, 32)
	return name, math.Float32frombits(uint32(bits)), nil
}

// truncate keeps error messages short for long garbage lines.
func truncate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// ReadCacheFile reads and parses a TensorRT calibration cache.
func ReadCacheFile(path string) (Cache, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Cache{}, fmt.Errorf("reading calibration cache: %w", err)
	}
	c, err := ParseCache(data)
	if err != nil {
		return Cache{}, fmt.Errorf("reading calibration cache %s: %w", path, err)
	}
	return c, nil
}

// Marshal renders the cache byte for byte as TensorRT writes it: the header,
// then "<name>: %08x\n" of math.Float32bits(scale) per tensor in name order.
// The algorithm defaults to EntropyCalibration2. Names must be non-empty and
// free of newlines.
func (c Cache) Marshal() ([]byte, error) {
	algo := c.Algorithm
	if algo == "" {
		algo = EntropyCalibration2
	}
	if !validAlgorithm(algo) {
		return nil, fmt.Errorf("calibration cache algorithm %q is not a calibrator name", algo)
	}
	if c.Version < 0 {
		return nil, fmt.Errorf("calibration cache version %d is negative", c.Version)
	}
	names := make([]string, 0, len(c.Scales))
	for name := range c.Scales {
		if name == "" || strings.ContainsRune(name, '\n') {
			return nil, fmt.Errorf("tensor name %q cannot be written to a calibration cache", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var b bytes.Buffer
	fmt.Fprintf(&b, "TRT-%d-%s\n", c.Version, algo)
	for _, name := range names {
		fmt.Fprintf(&b, "%s: %08x\n", name, math.Float32bits(c.Scales[name]))
	}
	return b.Bytes(), nil
}

// WriteCacheFile writes the cache to path atomically.
func WriteCacheFile(path string, c Cache) error {
	data, err := c.Marshal()
	if err != nil {
		return fmt.Errorf("writing calibration cache %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing calibration cache: %w", err)
	}
	return nil
}

// IncompatibleCacheError says why TensorRT would not use a calibration cache.
// TensorRT does not report this itself: it silently ignores a cache whose
// header does not match and calibrates on whatever data it has (random data
// under trtexec).
type IncompatibleCacheError struct {
	CacheVersion  int                 // the number in the cache header
	TargetVersion manifest.TRTVersion // the TensorRT that will build the engine
	Algorithm     string              // from the cache header
	Reason        string
}

func (e *IncompatibleCacheError) Error() string {
	return fmt.Sprintf("calibration cache TRT-%d-%s cannot be used with TensorRT %s (%d): %s",
		e.CacheVersion, e.Algorithm, e.TargetVersion, e.TargetVersion.Number(), e.Reason)
}

// CheckCompatible reports whether TensorRT release target (read it from
// trtexec's "[TensorRT v100300]" banner) would use the cache with trtexec --calib. It returns an *IncompatibleCacheError
// when the header's version differs, when the algorithm is not
// EntropyCalibration2, or when the target is TensorRT 11 or later, which
// has no implicit INT8 calibration (use the Q/DQ model instead).
func CheckCompatible(c Cache, target manifest.TRTVersion) error {
	e := &IncompatibleCacheError{CacheVersion: c.Version, TargetVersion: target, Algorithm: c.Algorithm}
	switch {
	case target.Major >= 11:
		e.Reason = "TensorRT 11 removed --int8 and --calib; build from the Q/DQ ONNX model"
	case c.Algorithm != EntropyCalibration2:
		e.Reason = fmt.Sprintf("trtexec calibrates with %s and ignores a %s cache", EntropyCalibration2, c.Algorithm)
	case c.Version != target.Number():
		e.Reason = fmt.Sprintf("the cache was written for TensorRT %s and TensorRT ignores a cache from another version; rewrite it with version %d",
			headerRelease(c.Version), target.Number())
	default:
		return nil
	}
	return e
}
