#!/usr/bin/env bash
# Peak memory of the FP16 rewrite of a ~100 MB model (load + ToFP16 + save),
# next to the load and save baselines of bench/peakmem.sh; then the
# rewrite's speed against plain load+save.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/fp16mem" ./bench/fp16mem
go build -o "$tmp/peakmem" ./bench/peakmem
"$tmp/fp16mem" -gen 100 -o "$tmp/wide.onnx"
for mode in read load save; do "$tmp/peakmem" -mode $mode "$tmp/wide.onnx"; done
"$tmp/fp16mem" "$tmp/wide.onnx"
go test -run '^$' -bench FP16Wide100MB -benchmem -count 3 ./convert/
