#!/usr/bin/env bash
# Render the pages of two real documents that Debian ships as PDF
# (libtasn1-doc's manual, shared-mime-info's specification) to PNG at 72 dpi
# in a git-ignored cache: 53 printed pages, what a text detector such as
# PP-OCRv4 det is calibrated and judged on. The packages are fetched with
# apt-get download + dpkg -x (nothing installed), the PDFs checked by sha256;
# pdftoppm comes from poppler-utils. Idempotent.
set -euo pipefail
dest=${1:-.cache/images/pages}
# package  path in the package  sha256  page prefix
docs=(
  "libtasn1-doc usr/share/doc/libtasn1-doc/libtasn1.pdf 3917eb460d87e275f9792b3597029873fd77890ed3ccebe40bbc5a3a7ee516d3 tasn1"
  "shared-mime-info usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf 4d9666c46b4d367a12e2922f4f3b114396c377106c57bbc934d03320e6888002 mime"
)
[[ -f $dest/.complete ]] && exit 0
command -v pdftoppm >/dev/null || { echo "pdftoppm not found: apt-get install -y poppler-utils" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/pages"
for d in "${docs[@]}"; do
  read -r pkg path sha prefix <<<"$d"
  (cd "$tmp" && { apt-get download "$pkg" >/dev/null 2>&1 || { apt-get update -qq && apt-get download "$pkg" >/dev/null; }; })
  dpkg -x "$tmp/${pkg}"_*.deb "$tmp/x"
  echo "$sha  $tmp/x/$path" | sha256sum -c --quiet - || { echo "sha256 of $pkg's $path does not match $sha" >&2; exit 1; }
  pdftoppm -r 72 -png "$tmp/x/$path" "$tmp/pages/$prefix"
done
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.tmp" && mv "$tmp/pages" "$dest.tmp" && touch "$dest.tmp/.complete"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "rendered $(ls "$dest" | wc -l) document pages in $dest" >&2
