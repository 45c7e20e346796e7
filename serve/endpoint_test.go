package serve

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ort"
	"github.com/kiln-ml/kiln/pbtxt"
	"github.com/kiln-ml/kiln/serve/kserve"
	"github.com/kiln-ml/kiln/serve/report"
)

// The --triton client, checked against kiln's own endpoint on loopback (a
// real server, not a mock): the model served over HTTP passes against the
// local fp32 reference, and the endpoint counted the requests.
func TestTritonClientAgainstOwnEndpoint(t *testing.T) {
	dir, _ := testRepo(t, true)
	e, err := NewEndpoint(dir, nil, ort.SessionOptions{}, kserve.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if len(e.Served) != 1 || !strings.Contains(e.Skipped["tinynet_trt_fp16_b4"], "needs Triton") {
		t.Fatalf("endpoint served %v, skipped %v; want the ONNX model served and the plan skipped for Triton", e.Served, e.Skipped)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	client := kserve.NewClient(srv.URL, srv.Client())
	rep, err := Run(context.Background(), Config{Repository: dir, Models: []string{"tinynet_onnx_fp32_b4"}, Feed: check.FeedSpec{Samples: 4}, Perf: PerfConfig{Disabled: true}},
		WithRuntime(pbtxt.PlatformONNX, Triton{Client: client}))
	if err != nil {
		t.Fatal(err)
	}
	if got := verdicts(rep); got["tinynet_onnx_fp32_b4"] != report.Pass {
		t.Fatalf("verdicts over HTTP = %v (%+v), want pass", got, rep.Models)
	}
	metrics := httptest.NewServer(e.MetricsHandler())
	defer metrics.Close()
	resp, err := http.Get(metrics.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 4 random samples, one request each.
	if !strings.Contains(string(body), `nv_inference_request_success{model="tinynet_onnx_fp32_b4",version="1"} 4`) {
		t.Errorf("metrics after 4 requests:\n%s\nwant nv_inference_request_success 4 for the model", body)
	}
}

// A model the server does not have is a load error, not a pass.
func TestTritonMissingModel(t *testing.T) {
	dir, _ := testRepo(t, false)
	other, _ := testRepo(t, true)
	e, err := NewEndpoint(dir, nil, ort.SessionOptions{}, kserve.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	rt := Triton{Client: kserve.NewClient(srv.URL, srv.Client())}
	rep, err := Run(context.Background(), Config{Repository: other, Feed: check.FeedSpec{Samples: 1}, Perf: PerfConfig{Disabled: true}},
		WithRuntime(pbtxt.PlatformTensorRT, rt))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rep.Models {
		if m.Platform == pbtxt.PlatformTensorRT && (m.Verdict != report.Errored || !strings.Contains(m.Reason, "ready")) {
			t.Errorf("plan missing on the server = %s (%s), want error saying it is not ready", m.Verdict, m.Reason)
		}
	}
}
