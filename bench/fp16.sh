#!/usr/bin/env bash
# Peak memory of the FP16 rewrite of a ~100 MB model (load + fp16.Convert + save)
# next to reading, loading and saving the same file, each in its own
# process; then the rewrite's speed against plain load+save.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/peakmem" ./bench/peakmem
"$tmp/peakmem" -gen 100 -o "$tmp/wide.onnx"
for mode in read load save fp16; do "$tmp/peakmem" -mode $mode "$tmp/wide.onnx"; done
go test -run '^$' -bench FP16Ratio -benchtime 5x -count 2 ./convert/fp16/
