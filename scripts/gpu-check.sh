#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, TensorRT and trtexec on PATH,
# build fp32, fp16 and int8 TensorRT engines of the model kiln ships
# (testdata/tinynet.onnx) through `kiln convert`, then load and time each
# engine with `trtexec --loadEngine`, and check the whole repository with
# `kiln serve` (plans through trtexec, ONNX variants on ONNX Runtime's CUDA
# provider, which needs KILN_ORT_LIB to name a GPU build of ONNX Runtime;
# without one that step is skipped and says so). Not part of `make test`; run it with
# `make gpu-check` or directly. Exits non-zero on the first failure.
#
# Environment: TRTEXEC (default: trtexec on PATH), KILN_ORT_LIB (as for kiln),
# OUT (default: a temporary directory, kept and printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
TRTEXEC=${TRTEXEC:-$(command -v trtexec || true)}
[[ -n "$TRTEXEC" && -x "$TRTEXEC" ]] || { echo "gpu-check: trtexec not found (set TRTEXEC or put it on PATH)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
OUT=${OUT:-$(mktemp -d /tmp/kiln-gpu-check.XXXXXX)}
make --no-print-directory ort build >&2

echo "== calibration data and int8 calibration (ONNX Runtime)"
go run ./internal/testmodels/gen -images "$OUT/images" -n 128
./kiln calibrate testdata/tinynet.onnx --data "$OUT/images" --preprocess "scale=0.00392157,layout=NCHW" -o "$OUT/calib"

echo "== engines through kiln convert"
./kiln convert testdata/tinynet.onnx --repo "$OUT/repo" --trtexec "$TRTEXEC" \
    --runtime trt --precision fp32,fp16,int8 --max-batch 8 --calib-dir "$OUT/calib"
./kiln pbtxt lint "$OUT/repo"

echo "== load and time every engine"
for plan in "$OUT"/repo/tinynet_trt_*/1/model.plan; do
    echo "-- $plan"
    "$TRTEXEC" --loadEngine="$plan" --shapes=images:8x3x32x32 --iterations=50 --duration=0 --warmUp=100 \
        | tee "$plan.check.log" | grep -E '^&&&& (PASSED|FAILED)|Throughput|GPU Compute Time' || true
    grep -q '^&&&& PASSED' "$plan.check.log" || { echo "gpu-check: $plan failed to load" >&2; exit 1; }
done
echo "== kiln serve: every artifact against fp32 on the calibration's validation split"
./kiln serve "$OUT/repo" --calib-dir "$OUT/calib" --trtexec "$TRTEXEC" -o "$OUT/serve-cpu"
if ./kiln inspect --run --device cuda testdata/tinynet.onnx >/dev/null 2>&1; then
    ./kiln serve "$OUT/repo" --calib-dir "$OUT/calib" --trtexec "$TRTEXEC" --device cuda -o "$OUT/serve-cuda"
else
    echo "gpu-check: this ONNX Runtime has no CUDA provider (set KILN_ORT_LIB to a GPU build): kiln serve --device cuda skipped" >&2
fi
echo "gpu-check: all engines built, loaded and checked; results and reports in $OUT"
