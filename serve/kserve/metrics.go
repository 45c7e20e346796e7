package kserve

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The values of the reason label of nv_inference_request_failure, as Triton
// reports them since 24.x: REJECTED for requests the scheduler turned away
// (busy, timed out in the queue, shutting down), CANCELED for requests the
// client gave up on, BACKEND for failures of the model itself and OTHER for
// the rest (bad requests).
const (
	reasonRejected = "REJECTED"
	reasonCanceled = "CANCELED"
	reasonBackend  = "BACKEND"
	reasonOther    = "OTHER"
)

var failureReasons = []string{reasonOther, reasonBackend, reasonCanceled, reasonRejected}

// metrics holds Triton's per-model inference metrics. Latencies are
// cumulative counters in microseconds, as Triton exports them by default.
type metrics struct {
	success, failure, inferences, execs            *prometheus.CounterVec
	requestUS, queueUS, inputUS, inferUS, outputUS *prometheus.CounterVec
	pending                                        *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := []string{"model", "version"}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(labels[:2:2], extra...))
	}
	m := &metrics{
		success:    counter("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
		failure:    counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "reason"),
		inferences: counter("nv_inference_count", "Number of inferences performed (a batch of n counts n)"),
		execs:      counter("nv_inference_exec_count", "Number of model executions performed"),
		requestUS:  counter("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds"),
		queueUS:    counter("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
		inputUS:    counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
		inferUS:    counter("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
		outputUS:   counter("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nv_inference_pending_request_count",
			Help: "Instantaneous number of pending requests awaiting execution per-model"}, labels),
	}
	for _, c := range []prometheus.Collector{m.success, m.failure, m.inferences, m.execs, m.requestUS,
		m.queueUS, m.inputUS, m.inferUS, m.outputUS, m.pending} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("registering metrics: %w (give each Server its own registry)", err)
			}
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}

// modelMetrics are the metrics of one model version, labels bound.
type modelMetrics struct {
	success, inferences, execs                     prometheus.Counter
	requestUS, queueUS, inputUS, inferUS, outputUS prometheus.Counter
	failure                                        map[string]prometheus.Counter
	pending                                        prometheus.Gauge
}

func (m *metrics) forModel(name, version string) *modelMetrics {
	l := prometheus.Labels{"model": name, "version": version}
	mm := &modelMetrics{
		success: m.success.With(l), inferences: m.inferences.With(l), execs: m.execs.With(l),
		requestUS: m.requestUS.With(l), queueUS: m.queueUS.With(l), inputUS: m.inputUS.With(l),
		inferUS: m.inferUS.With(l), outputUS: m.outputUS.With(l), pending: m.pending.With(l),
		failure: map[string]prometheus.Counter{},
	}
	// Triton exports every reason from the start, at 0.
	for _, r := range failureReasons {
		mm.failure[r] = m.failure.With(prometheus.Labels{"model": name, "version": version, "reason": r})
	}
	return mm
}

func addUS(c prometheus.Counter, d time.Duration) {
	c.Add(float64(d.Microseconds()))
}
