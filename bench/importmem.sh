#!/usr/bin/env bash
# Peak memory of importing a SavedModel with ~100 MB of variables (what
# `kiln import` does: savedmodel.Open, Convert, Save) next to reading the
# same files, each in its own process, a few times.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/peakmem" ./bench/peakmem
"$tmp/peakmem" -savedmodel 100 -o "$tmp/sm"
for i in 1 2 3; do for mode in read import; do "$tmp/peakmem" -mode $mode "$tmp/sm"; done; done
