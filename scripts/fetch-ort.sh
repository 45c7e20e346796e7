#!/usr/bin/env bash
# Fetch ONNX Runtime's CPU library from the npm package onnxruntime-node
# without running its install scripts (npm pack + tar), and check its sha256.
set -euo pipefail
ver=$1 sha=$2 dest=$3
lib=$dest/libonnxruntime.so.1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching onnxruntime-node@$ver (CPU build of libonnxruntime) ..." >&2
(cd "$tmp" && npm pack "onnxruntime-node@$ver" --silent >/dev/null)
mkdir -p "$tmp/x"
tar -xzf "$tmp/onnxruntime-node-$ver.tgz" -C "$tmp/x" --strip-components=5 \
    package/bin/napi-v6/linux/x64/libonnxruntime.so.1
echo "$sha  $tmp/x/libonnxruntime.so.1" | sha256sum -c --quiet - || {
    echo "sha256 of libonnxruntime.so.1 from onnxruntime-node@$ver does not match $sha" >&2; exit 1; }
mkdir -p "$dest"
mv "$tmp/x/libonnxruntime.so.1" "$lib.tmp" && mv "$lib.tmp" "$lib"
echo "installed $lib" >&2
