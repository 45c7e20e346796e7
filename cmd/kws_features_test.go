package cmd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"os"
	"testing"
)

// Features for MLPerf Tiny's keyword-spotting DS-CNN, computed as its
// training pipeline (keyword_spotting/get_dataset.py, feature_type mfcc)
// computes them in TensorFlow: 16 kHz audio scaled by its maximum, padded
// to one second and clipped to [-1,1]; tf.signal.stft with 30 ms frames
// (480 samples) every 20 ms (320), a periodic Hann window and a 512-point
// FFT; magnitudes through tf.signal.linear_to_mel_weight_matrix (40 HTK
// mel bands, 20-4000 Hz); log(mel + 1e-6);
// tf.signal.mfccs_from_log_mel_spectrograms (an unnormalized DCT-II scaled
// by 1/sqrt(2·40)), keeping 10 coefficients: [49, 10, 1].
const (
	kwsRate    = 16000
	kwsFrame   = 480
	kwsStep    = 320
	kwsFFT     = 512
	kwsMel     = 40
	kwsMFCC    = 10
	kwsFrames  = 1 + (kwsRate-kwsFrame)/kwsStep // 49
	kwsMelLow  = 20.0
	kwsMelHigh = 4000.0
)

// readWAV reads a mono 16-bit PCM WAV file: its samples and rate.
func readWAV(path string) ([]float64, int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	return parseWAV(path, b)
}

func parseWAV(path string, b []byte) ([]float64, int, error) {
	if len(b) < 12 || string(b[:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, 0, fmt.Errorf("%s: not a RIFF WAVE file", path)
	}
	var rate int
	for off := 12; off+8 <= len(b); {
		id, size := string(b[off:off+4]), int(binary.LittleEndian.Uint32(b[off+4:]))
		if size < 0 || size > len(b) {
			return nil, 0, fmt.Errorf("%s: chunk %q of %d bytes overruns the file", path, id, size)
		}
		body := b[off+8 : min(off+8+size, len(b))]
		switch id {
		case "fmt ":
			if len(body) < 16 || binary.LittleEndian.Uint16(body) != 1 || binary.LittleEndian.Uint16(body[2:]) != 1 || binary.LittleEndian.Uint16(body[14:]) != 16 {
				return nil, 0, fmt.Errorf("%s: not mono 16-bit PCM", path)
			}
			rate = int(binary.LittleEndian.Uint32(body[4:]))
		case "data":
			if rate <= 0 {
				return nil, 0, fmt.Errorf("%s: data before fmt", path)
			}
			out := make([]float64, len(body)/2)
			for i := range out {
				out[i] = float64(int16(binary.LittleEndian.Uint16(body[2*i:])))
			}
			return out, rate, nil
		}
		off += 8 + size + size%2
	}
	return nil, 0, errors.New(path + ": no data chunk")
}

// resample changes the rate of x by linear interpolation.
func resample(x []float64, from, to int) []float64 {
	if from == to {
		return x
	}
	n := len(x) * to / from
	out := make([]float64, n)
	for i := range out {
		p := float64(i) * float64(from) / float64(to)
		j := int(p)
		f := p - float64(j)
		a, b := x[min(j, len(x)-1)], x[min(j+1, len(x)-1)]
		out[i] = a*(1-f) + b*f
	}
	return out
}

// recording makes a clip look like a Speech Commands recording: scaled to
// a peak of 1, centred in one second, over a noise floor (Gaussian, 0.003
// of the peak, about -50 dB, seeded) where a phone recording has room
// noise rather than digital silence.
func recording(x []float64, seed uint64) []float64 {
	peak := 0.0
	for _, v := range x {
		peak = max(peak, math.Abs(v))
	}
	out := make([]float64, kwsRate)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range out {
		out[i] = 0.003 * rng.NormFloat64()
	}
	start := max(0, (kwsRate-len(x))/2)
	for i, v := range x[:min(len(x), kwsRate)] {
		out[start+i] += v / peak
	}
	return out
}

func hzToMel(f float64) float64 { return 1127 * math.Log(1+f/700) }

// melMatrix is tf.signal.linear_to_mel_weight_matrix: [bins][mel].
func melMatrix(bins int) [][]float64 {
	edges := make([]float64, kwsMel+2)
	lo, hi := hzToMel(kwsMelLow), hzToMel(kwsMelHigh)
	for i := range edges {
		edges[i] = lo + (hi-lo)*float64(i)/float64(kwsMel+1)
	}
	w := make([][]float64, bins)
	for k := range w {
		w[k] = make([]float64, kwsMel)
		if k == 0 {
			continue // the DC bin is zeroed
		}
		m := hzToMel(float64(kwsRate/2) * float64(k) / float64(bins-1))
		for j := range kwsMel {
			lower := (m - edges[j]) / (edges[j+1] - edges[j])
			upper := (edges[j+2] - m) / (edges[j+2] - edges[j+1])
			w[k][j] = max(0, min(lower, upper))
		}
	}
	return w
}

// mfccFeatures computes the model's [49,10,1] features of 16 kHz audio.
func mfccFeatures(audio []float64) []float32 {
	x := make([]float64, kwsRate)
	peak := 0.0
	for _, v := range audio {
		peak = max(peak, v)
	}
	for i := range min(len(audio), kwsRate) {
		x[i] = max(-1, min(1, audio[i]/peak))
	}
	bins := kwsFFT/2 + 1
	mel := melMatrix(bins)
	out := make([]float32, 0, kwsFrames*kwsMFCC)
	frame := make([]complex128, kwsFFT)
	logMel := make([]float64, kwsMel)
	for f := range kwsFrames {
		for i := range frame {
			frame[i] = 0
		}
		for i := range kwsFrame {
			hann := 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/kwsFrame)
			frame[i] = complex(x[f*kwsStep+i]*hann, 0)
		}
		spec := fft(frame)
		for j := range kwsMel {
			s := 0.0
			for k := range bins {
				s += cmplx.Abs(spec[k]) * mel[k][j]
			}
			logMel[j] = math.Log(s + 1e-6)
		}
		for c := range kwsMFCC {
			s := 0.0
			for n, v := range logMel {
				s += v * math.Cos(math.Pi*float64(c)*(2*float64(n)+1)/(2*kwsMel))
			}
			out = append(out, float32(2*s/math.Sqrt(2*kwsMel)))
		}
	}
	return out
}

// fft is a radix-2 FFT of a power-of-two length.
func fft(x []complex128) []complex128 {
	n := len(x)
	if n == 1 {
		return []complex128{x[0]}
	}
	even, odd := make([]complex128, n/2), make([]complex128, n/2)
	for i := range n / 2 {
		even[i], odd[i] = x[2*i], x[2*i+1]
	}
	e, o := fft(even), fft(odd)
	out := make([]complex128, n)
	for k := range n / 2 {
		t := cmplx.Exp(complex(0, -2*math.Pi*float64(k)/float64(n))) * o[k]
		out[k], out[k+n/2] = e[k]+t, e[k]-t
	}
	return out
}

func FuzzParseWAV(f *testing.F) {
	hdr := []byte("RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00data\x04\x00\x00\x00\x01\x00\xff\xff")
	f.Add(hdr)
	f.Add(hdr[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		x, rate, err := parseWAV("fuzz.wav", b)
		if err == nil && (rate <= 0 || len(x) > len(b)/2) {
			t.Fatalf("parseWAV = %d samples at %d Hz from %d bytes", len(x), rate, len(b))
		}
	})
}
