#!/usr/bin/env bash
# Fetch real photographs and scans of text that Debian's python3-skimage
# ships (skimage/data, BSD-3-Clause / public domain, see its README.txt)
# into a git-ignored cache, with apt-get download + dpkg -x (nothing is
# installed system-wide), and check every file's sha256. Idempotent.
set -euo pipefail
dest=${1:-.cache/images/skimage}
# name  sha256
images=(
  "page.png 341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3"
  "text.png bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1"
  "astronaut.png 88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"
  "coffee.png cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"
  "chelsea.png 596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"
  "rocket.jpg c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"
  "motorcycle_left.png db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179"
)
ok() { [[ -f $1 ]] && echo "$2  $1" | sha256sum -c --quiet - 2>/dev/null; }
missing=0
for i in "${images[@]}"; do
  read -r name sha <<<"$i"
  ok "$dest/$name" "$sha" || missing=1
done
[[ $missing == 0 ]] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching python3-skimage (apt-get download) for its sample images ..." >&2
(cd "$tmp" && { apt-get download python3-skimage >/dev/null 2>&1 || { apt-get update -qq && apt-get download python3-skimage >/dev/null; }; })
dpkg -x "$tmp"/python3-skimage_*.deb "$tmp/x"
src=$tmp/x/usr/lib/python3/dist-packages/skimage/data
mkdir -p "$dest"
for i in "${images[@]}"; do
  read -r name sha <<<"$i"
  echo "$sha  $src/$name" | sha256sum -c --quiet - || { echo "sha256 of skimage/data/$name does not match $sha" >&2; exit 1; }
  cp "$src/$name" "$dest/$name.tmp" && mv "$dest/$name.tmp" "$dest/$name"
done
echo "installed ${#images[@]} images in $dest" >&2
