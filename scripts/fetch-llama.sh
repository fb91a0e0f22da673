#!/usr/bin/env bash
# Obtains llama.cpp at the pinned commit from the npm package node-llama-cpp@3.21.1,
# which ships llama.cpp's source as a git bundle. Checks the package's integrity, the
# bundle's sha256 and the commit id; stops with a clear message if any is wrong.
#
# usage: scripts/fetch-llama.sh [DEST]      (default DEST: third_party/llama.cpp)
# To use your own llama.cpp checkout instead, skip this script and configure with
#   cmake -DWARMCTX_LLAMA_DIR=/path/to/llama.cpp ...
set -euo pipefail

PKG="node-llama-cpp@3.21.1"
INTEGRITY="sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg=="
BUNDLE_SHA256="9336d8aab8f8e6a8919380f3641fe92e57b02fb55df1b6bd083b82491a6293b8"
COMMIT="80fb11ac73e66d89eae2c6a91d8a77428fa733ed"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/third_party/llama.cpp}"
cache="${WARMCTX_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/warmctx}/npm"

die() { echo "fetch-llama: error: $*" >&2; exit 1; }

if [ -d "$dest/.git" ]; then
  have="$(git -C "$dest" rev-parse HEAD 2>/dev/null || true)"
  if [ "$have" = "$COMMIT" ]; then
    echo "fetch-llama: $dest is already at the pinned commit $COMMIT"
    exit 0
  fi
  die "$dest exists but is at commit '${have:-unknown}', not $COMMIT. Remove it, or build against it with -DWARMCTX_LLAMA_DIR=$dest."
fi

command -v npm >/dev/null || die "npm is not installed (apt-get install npm)"
command -v git >/dev/null || die "git is not installed (apt-get install git)"
mkdir -p "$cache"
tgz="$cache/node-llama-cpp-3.21.1.tgz"
if [ ! -f "$tgz" ]; then
  echo "fetch-llama: downloading $PKG (about 35 MB) ..."
  (cd "$cache" && npm pack "$PKG" --silent >/dev/null) || die "npm pack $PKG failed (is the npm registry reachable?)"
fi
[ -f "$tgz" ] || die "npm pack did not produce $tgz"

got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$got" != "$INTEGRITY" ]; then
  rm -f "$tgz"
  die "integrity check failed for $PKG: expected $INTEGRITY, got $got (the file was removed; run again)"
fi
echo "fetch-llama: package integrity ok"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "$tgz" -C "$work" package/llama/gitRelease.bundle || die "the package has no package/llama/gitRelease.bundle"
bundle="$work/package/llama/gitRelease.bundle"
got="$(sha256sum "$bundle" | cut -d' ' -f1)"
[ "$got" = "$BUNDLE_SHA256" ] || die "bundle sha256 mismatch: expected $BUNDLE_SHA256, got $got"
echo "fetch-llama: bundle sha256 ok"

mkdir -p "$(dirname "$dest")"
git clone --quiet "$bundle" "$dest.tmp.$$" || die "git clone of the bundle failed"
git -C "$dest.tmp.$$" -c advice.detachedHead=false checkout --quiet "$COMMIT" || die "commit $COMMIT is not in the bundle"
have="$(git -C "$dest.tmp.$$" rev-parse HEAD)"
[ "$have" = "$COMMIT" ] || { rm -rf "$dest.tmp.$$"; die "checked out $have, expected $COMMIT"; }
mv "$dest.tmp.$$" "$dest"
echo "fetch-llama: llama.cpp $COMMIT is at $dest"
