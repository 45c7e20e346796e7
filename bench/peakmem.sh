#!/usr/bin/env bash
# Peak memory of loading and saving a ~100 MB model against reading its bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/peakmem" ./bench/peakmem
"$tmp/peakmem" -gen 100 -o "$tmp/wide.onnx"
for mode in read load save; do "$tmp/peakmem" -mode $mode "$tmp/wide.onnx"; done
