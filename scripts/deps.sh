#!/usr/bin/env bash
# Installs what exo needs, from Debian 12 packages and npm. Idempotent: a second run installs
# nothing. Uses sudo when not root.
#
#   scripts/deps.sh        everything to build and test (make test): compilers, libraries, the
#                          unit-test framework, network tools, node + the e2e npm packages, chromium
#   scripts/deps.sh run    only what building and running a node needs (make run)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}

RUN_PACKAGES=(
  build-essential pkg-config
  libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libssl-dev
  libczmq-dev libzmq3-dev libsodium-dev libopenblas-dev libgloo-dev
  curl ca-certificates
)
TEST_PACKAGES=(
  clang libcmocka-dev
  iproute2 iptables nftables wrk
  nodejs npm chromium python3 python3-jinja2
)
APT_PACKAGES=("${RUN_PACKAGES[@]}")
if [ "$mode" != run ]; then APT_PACKAGES+=("${TEST_PACKAGES[@]}"); fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # node/npm may come from elsewhere (nodesource, nvm): accept a working binary.
    case "$p" in
      nodejs) command -v node >/dev/null && continue ;;
      npm) command -v npm >/dev/null && continue ;;
      python3) command -v python3 >/dev/null && continue ;;
      python3-jinja2) python3 -c 'import jinja2' 2>/dev/null && continue ;;
    esac
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The aarch64 cross build and its tests under qemu-user (make test-aarch64, part of make test):
# the cross compiler, qemu, and the arm64 multiarch libraries the engine half links (see the
# Makefile's CROSS section for why only these). EXO_DEPS_CROSS=0 skips them.
CROSS_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
CROSS_ARM64=(libjansson-dev libutf8proc-dev libopenblas-dev libcmocka-dev libsodium-dev libpcre2-8-0)
if [ "${EXO_DEPS_CROSS:-1}" != 0 ] && [ "$(dpkg --print-architecture)" = amd64 ]; then
  missing=()
  for p in "${CROSS_PACKAGES[@]}" "${CROSS_ARM64[@]/%/:arm64}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi
[ "${1:-}" = --cross ] && exit 0

# npm packages for end-to-end tests and tokenizer fixtures (pinned by the lock file). The stamp
# holds the lock file's hash, so a checkout with a newer mtime but the same lock reinstalls nothing.
if [ "$mode" != run ] && [ -f tests/e2e/package.json ]; then
  want=$(sha256sum tests/e2e/package-lock.json | cut -d' ' -f1)
  have=$(cat tests/e2e/node_modules/.stamp 2>/dev/null || true)
  if [ "$want" != "$have" ]; then
    echo "deps: npm ci in tests/e2e"
    (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error && echo "$want" > node_modules/.stamp)
  fi
fi
