#!/bin/bash
# Compute Engine startup script: the GPU step on a VM instead of a Cloud Run job (for GPU types
# Cloud Run does not offer, a region without Cloud Run GPUs, or builds past a job's task timeout).
# The VM runs Container-Optimized OS, installs the NVIDIA driver with cos-extensions, copies the
# CPU steps' stage (model.onnx, calib/) from gs://, runs workflows/gpu-build.sh in the kiln-gpu
# image with the GPU passed through, and powers itself off (a stopped VM bills only its disk).
#
# Create it with the settings as instance metadata (an L4 on a G2 machine; engines must be built
# on the GPU type they will serve on, so pick the serving GPU):
#
#   gcloud compute instances create kiln-gpu-build --zone us-central1-a \
#     --machine-type g2-standard-8 --accelerator type=nvidia-l4,count=1 \
#     --maintenance-policy TERMINATE --image-family cos-stable --image-project cos-cloud \
#     --boot-disk-size 100GB --scopes cloud-platform \
#     --metadata-from-file startup-script=workflows/gpu-vm-startup.sh \
#     --metadata kiln-image=REGION-docker.pkg.dev/PROJECT/REPO/kiln-gpu:latest,kiln-stage=gs://BUCKET/kiln/BUILD/stage,kiln-model=MODEL,kiln-repo=gs://BUCKET/kiln/BUILD/onnx,kiln-dest-gcs=gs://BUCKET/models/MODEL,kiln-dest-image=REGION-docker.pkg.dev/PROJECT/REPO/MODEL-triton:BUILD
#
# The VM's service account needs storage access to the bucket and Artifact Registry reader and
# writer roles on the repository. The log is the serial console and Cloud Logging (startup-script).
set -euo pipefail

md() {
    curl -fsS -H 'Metadata-Flavor: Google' \
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}
image=$(md kiln-image)
stage=$(md kiln-stage)
work=/mnt/stateful_partition/kiln
mkdir -p "$work"

# The NVIDIA driver on Container-Optimized OS, made executable for containers.
cos-extensions install gpu
mount --bind /var/lib/nvidia /var/lib/nvidia
mount -o remount,exec /var/lib/nvidia
/var/lib/nvidia/bin/nvidia-smi

# Artifact Registry credentials from the VM's service account.
docker-credential-gcr configure-docker --registries "${image%%/*}"

# The stage from gs:// (Container-Optimized OS has no gcloud; the Cloud SDK image does).
docker run --rm -v "$work:/work" gcr.io/google.com/cloudsdktool/google-cloud-cli:slim \
    gcloud storage cp -r "$stage" /work/

devices=()
for d in /dev/nvidia[0-9]* /dev/nvidia-uvm /dev/nvidiactl; do
    devices+=(--device "$d:$d")
done
status=0
docker run --rm "${devices[@]}" \
    -v /var/lib/nvidia/lib64:/usr/local/nvidia/lib64 -v /var/lib/nvidia/bin:/usr/local/nvidia/bin \
    -e LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    -v "$work:/mnt/kiln" -e KILN_STAGE="/mnt/kiln/$(basename "$stage")" \
    -e KILN_MODEL="$(md kiln-model)" -e KILN_REPO="$(md kiln-repo)" \
    -e KILN_DEST_GCS="$(md kiln-dest-gcs)" -e KILN_DEST_IMAGE="$(md kiln-dest-image)" \
    --entrypoint kiln-gpu-build "$image" || status=$?
echo "kiln-gpu-build exited $status"
poweroff
