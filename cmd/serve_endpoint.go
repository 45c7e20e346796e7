package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/internal/execx"
	"github.com/kiln-ml/kiln/serve"
	"github.com/kiln-ml/kiln/serve/kserve"
)

// endpointFlags are serve's flags for the KServe v2 endpoint (--listen) and
// for checking through a running Triton (--triton, --start-triton).
type endpointFlags struct {
	listen, metricsListen string
	maxConcurrency        int
	maxRequest            int64
	requestTimeout        time.Duration
	triton                string
	startTriton           bool
	tritonserver          string
}

func (o *endpointFlags) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", "", "serve the repository's ONNX models over KServe v2 on `ADDR` (127.0.0.1:8000) until SIGTERM, instead of checking them")
	f.StringVar(&o.metricsListen, "metrics-listen", "", "with --listen: Prometheus metrics (Triton's names) on `ADDR` (127.0.0.1:8002)")
	f.IntVar(&o.maxConcurrency, "max-concurrency", 64, "with --listen: inference requests handled at once (the rest wait, then get 503)")
	sizeFlag(f, &o.maxRequest, "max-request-size", kserve.DefaultMaxRequestBytes, "with --listen: largest request body, e.g. 64MiB (larger ones get 413)")
	f.DurationVar(&o.requestTimeout, "request-timeout", time.Minute, "with --listen: longest time one inference request may take")
	f.StringVar(&o.triton, "triton", "", "check the repository's models on a running Triton (or kiln serve --listen) at `URL` over KServe v2 HTTP")
	f.BoolVar(&o.startTriton, "start-triton", false, "start tritonserver (from PATH or --tritonserver) on the repository, check through it, stop it")
	f.StringVar(&o.tritonserver, "tritonserver", "", "tritonserver executable `PATH` for --start-triton (default: on PATH)")
}

// listen serves the repository until ctx is done, then shuts down
// gracefully: requests in flight finish, batchers drain.
func (o *endpointFlags) listenAndServe(ctx context.Context, repo string, so serveOptions, log *slog.Logger, out io.Writer) error {
	e, err := serve.NewEndpoint(repo, so.cfg.Models, so.session.options(),
		kserve.Options{MaxConcurrency: o.maxConcurrency, MaxRequestBytes: o.maxRequest, RequestTimeout: o.requestTimeout, Version: version(), Logger: log}, log)
	if err != nil {
		return err
	}
	defer e.Close()
	servers := []*http.Server{{Addr: o.listen, Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	if o.metricsListen != "" {
		servers = append(servers, &http.Server{Addr: o.metricsListen, Handler: e.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second})
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "serving on http://%s\n", ln.Addr())
		go func() { errc <- s.Serve(ln) }()
	}
	fmt.Fprintf(out, "models: %v\n", e.Served)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Shutdown(shut))
	}
	errs = append(errs, e.Shutdown(shut))
	return errors.Join(errs...)
}

// tritonRuntime returns the runtime that checks through Triton, starting
// tritonserver on the repository first with --start-triton; stop stops it.
func (o *endpointFlags) tritonRuntime(ctx context.Context, repo string, log *slog.Logger) (rt serve.Runtime, stop func(), err error) {
	url := o.triton
	stop = func() {}
	if o.startTriton {
		if url, stop, err = startTriton(ctx, o.tritonserver, repo, log); err != nil {
			return nil, nil, err
		}
	}
	return serve.Triton{Client: kserve.NewClient(url, nil)}, stop, nil
}

// startTriton launches tritonserver on repo on a free port, waits until it
// is ready and returns its URL and how to stop it.
func startTriton(ctx context.Context, explicit, repo string, log *slog.Logger) (string, func(), error) {
	path, err := execx.LookPath("tritonserver", explicit)
	if err != nil {
		return "", nil, fmt.Errorf("--start-triton: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(path, "--model-repository="+repo, "--http-port="+strconv.Itoa(port), "--allow-grpc=false", "--allow-metrics=false")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting %s: %w", path, err)
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	log.Info("waiting for tritonserver", "url", url)
	if err := kserve.NewClient(url, nil).WaitReady(wait, 500*time.Millisecond); err != nil {
		stop()
		return "", nil, fmt.Errorf("tritonserver on %s did not get ready: %w", repo, err)
	}
	return url, stop, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
