#!/usr/bin/env bash
# Downloads the Debian packages the demo model is trained on and unpacks them (no install) into
# DIR (default .cache/demo-data/root): dict-wn (WordNet 3.0 as a dictd database) and fortunes /
# fortunes-min (fortune cookie files). Needs apt's package lists (apt-get update).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.cache/demo-data}
mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && apt-get download -q dict-wn=1:3.0-37 fortunes=1:1.99.1-7.3 fortunes-min=1:1.99.1-7.3)
for d in "$dir"/debs/*.deb; do dpkg -x "$d" "$dir/root"; done
sha256sum "$dir"/debs/*.deb
