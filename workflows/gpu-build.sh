#!/usr/bin/env bash
# kiln's GPU step, run inside the kiln-gpu image (workflows/Dockerfile installs it as
# /usr/local/bin/kiln-gpu-build): by a Cloud Run job with an L4 (workflows/cloudbuild.yaml), by a
# Compute Engine GPU VM (workflows/gpu-vm-startup.sh) or by a self-hosted GPU runner
# (workflows/github-actions.yml). It takes the repository the CPU steps checked and published,
# adds the TensorRT engines, checks every artifact on this GPU and publishes the result.
#
# 1. kiln pack --from: read the CPU steps' repository (ONNX variants, their verdicts) back
# 2. kiln convert --runtime trt: build the engines with trtexec from the same source and calibration
# 3. kiln serve: check every artifact against the fp32 ONNX variant (plans through trtexec; with a
#    GPU build of ONNX Runtime in KILN_ORT_LIB also the ONNX variants on --device cuda)
# 4. kiln pack: publish to gs:// and as a Triton image, refusing plans that are not for this
#    TensorRT release and GPU
#
# Environment (the callers set it):
#   KILN_STAGE           directory holding the CPU steps' model.onnx and calib/ (a Cloud Storage
#                        volume mount or a copy; read only)
#   KILN_MODEL           model name, as the CPU steps' `kiln convert --name`
#   KILN_REPO            gs://BUCKET/PREFIX the CPU steps published the checked repository to
#   KILN_DEST_GCS        gs://BUCKET/PREFIX to publish the whole repository to
#   KILN_DEST_IMAGE      image reference to push the Triton serving image to
#   KILN_PRECISIONS      engine precisions (default fp32,fp16,int8)
#   KILN_MAX_BATCH       engine max batch (default 16)
#   KILN_TRT_VERSION     TensorRT release the engines are for (default 10.3, the image's)
#   KILN_COMPUTE_CAPABILITY  the GPU the engines are for (default 8.9, an L4)
#   KILN_WORK            scratch directory (default /tmp/kiln)
set -euo pipefail
: "${KILN_STAGE:?set KILN_STAGE}" "${KILN_MODEL:?set KILN_MODEL}" "${KILN_REPO:?set KILN_REPO}"
: "${KILN_DEST_GCS:?set KILN_DEST_GCS}" "${KILN_DEST_IMAGE:?set KILN_DEST_IMAGE}"
work=${KILN_WORK:-/tmp/kiln}
mkdir -p "$work"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true

echo "== the checked repository from the CPU steps"
kiln pack --from "$KILN_REPO" --to "dir:$work/repo" --progress plain

echo "== TensorRT engines"
kiln convert "$KILN_STAGE/model.onnx" --repo "$work/repo" --name "$KILN_MODEL" \
    --runtime trt --precision "${KILN_PRECISIONS:-fp32,fp16,int8}" --max-batch "${KILN_MAX_BATCH:-16}" \
    --calib-dir "$KILN_STAGE/calib" --trt-version "${KILN_TRT_VERSION:-10.3}" \
    --progress plain --format json > "$work/convert.json"

echo "== every artifact against fp32 on the calibration's validation split"
kiln serve "$work/repo" --calib-dir "$KILN_STAGE/calib" -o "$work/report"
if kiln inspect --run --device cuda "$KILN_STAGE/model.onnx" > /dev/null 2>&1; then
    kiln serve "$work/repo" --calib-dir "$KILN_STAGE/calib" --device cuda -o "$work/report-cuda"
else
    echo "kiln-gpu-build: this ONNX Runtime has no CUDA provider (set KILN_ORT_LIB to a GPU build): kiln serve --device cuda skipped" >&2
fi

echo "== publish"
kiln pack "$work/repo" --to "$KILN_DEST_GCS" --to "image:$KILN_DEST_IMAGE" \
    --trt-version "${KILN_TRT_VERSION:-10.3}" --compute-capability "${KILN_COMPUTE_CAPABILITY:-8.9}" \
    --progress plain
