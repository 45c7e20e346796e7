package kserve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// extensions are the protocol extensions the server reports in its
// metadata. Of the model repository extension only the index is served,
// so it is not claimed.
var extensions = []string{"binary_tensor_data"}

// apiError is an error with the HTTP status it is answered with and, for
// inference requests, the reason label of the failure metric.
type apiError struct {
	status int
	reason string
	err    error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

func badRequest(err error) error {
	return &apiError{status: http.StatusBadRequest, reason: reasonOther, err: err}
}

// routes lays out the endpoints. Every path without a version also has
// /versions/{version}; unknown paths get a JSON 404 like the rest.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/health/live", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v2/health/ready", s.handleReady)
	mux.HandleFunc("GET /v2", s.handleServerMetadata)
	mux.HandleFunc("GET /v2/{$}", s.handleServerMetadata)
	for _, p := range []string{"/v2/models/{model}", "/v2/models/{model}/versions/{version}"} {
		mux.HandleFunc("GET "+p, s.handleModelMetadata)
		mux.HandleFunc("GET "+p+"/ready", s.handleModelReady)
		mux.HandleFunc("POST "+p+"/infer", s.handleInfer)
	}
	mux.HandleFunc("POST /v2/repository/index", s.handleIndex)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.isClosed() {
		writeError(w, http.StatusServiceUnavailable, errShuttingDown.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleServerMetadata(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, ServerMetadata{Name: "kiln", Version: s.opts.Version, Extensions: slices.Clone(extensions)})
}

func (s *Server) handleModelMetadata(w http.ResponseWriter, r *http.Request) {
	sv, err := s.lookup(r.PathValue("model"), r.PathValue("version"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	md := ModelMetadata{Name: sv.Name, Platform: sv.Platform,
		Inputs: metadataShapes(sv.Inputs, sv.MaxBatchSize), Outputs: metadataShapes(sv.Outputs, sv.MaxBatchSize)}
	if r.PathValue("version") != "" {
		md.Versions = []string{sv.Version}
	} else {
		for _, v := range s.versions[sv.Name] {
			md.Versions = append(md.Versions, v.Version)
		}
		slices.Reverse(md.Versions)
	}
	writeJSON(w, http.StatusOK, md)
}

// metadataShapes reports shapes as Triton does: a model that batches gets
// a leading -1 for the batch dimension.
func metadataShapes(ts []TensorMeta, maxBatch int) []TensorMeta {
	out := make([]TensorMeta, len(ts))
	for i, t := range ts {
		out[i] = t
		out[i].Shape = append([]int64{}, t.Shape...)
		if maxBatch > 0 {
			out[i].Shape = append([]int64{-1}, t.Shape...)
		}
	}
	return out
}

func (s *Server) handleModelReady(w http.ResponseWriter, r *http.Request) {
	if _, err := s.lookup(r.PathValue("model"), r.PathValue("version")); err != nil {
		s.fail(w, r, err)
		return
	}
	s.handleReady(w, r)
}

// handleIndex answers Triton's repository index: every model version, and
// only the ready ones when the body says {"ready": true}.
func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Ready bool `json:"ready"`
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		s.fail(w, r, badRequest(fmt.Errorf("reading the body: %w", err)))
		return
	}
	if len(strings.TrimSpace(string(raw))) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			s.fail(w, r, badRequest(fmt.Errorf("parsing the body: %w", jsonError(raw, err))))
			return
		}
	}
	state, reason := "READY", ""
	if s.isClosed() {
		state, reason = "UNAVAILABLE", errShuttingDown.Error()
	}
	out := []RepositoryModel{}
	if !body.Ready || reason == "" {
		for _, vs := range s.versions {
			for _, sv := range vs {
				out = append(out, RepositoryModel{Name: sv.Name, Version: sv.Version, State: state, Reason: reason})
			}
		}
	}
	slices.SortFunc(out, func(a, b RepositoryModel) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return compareVersions(a.Version, b.Version)
	})
	writeJSON(w, http.StatusOK, out)
}

// fail answers an error: its status if it has one, else 500.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	var ae *apiError
	if errors.As(err, &ae) {
		status = ae.status
	}
	s.log.Debug("kserve request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	writeError(w, status, err.Error())
}
