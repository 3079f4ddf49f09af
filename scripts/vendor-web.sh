#!/usr/bin/env bash
# Copies the dashboard's third-party browser modules from npm (tests/e2e/node_modules) into
# web/vendor/. The result is committed, so serving the dashboard needs no build step; rerun this
# after changing the pinned versions in tests/e2e/package.json.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d tests/e2e/node_modules/marked ] || bash scripts/deps.sh
cp tests/e2e/node_modules/marked/lib/marked.esm.js web/vendor/marked.esm.js
cp tests/e2e/node_modules/marked/LICENSE web/vendor/marked.LICENSE
echo "vendored: $(ls web/vendor)"
