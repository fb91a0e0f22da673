#!/usr/bin/env bash
# One-time set-up and build: installs the Debian packages warmctx needs, obtains the
# pinned llama.cpp, and builds warmctx with it (CPU; WARMCTX_CUDA=1 for CUDA).
# Safe to run again: each step is skipped when already done.
#
# environment:
#   WARMCTX_BUILD_DIR   build directory (default: build)
#   WARMCTX_LLAMA_DIR   use this llama.cpp checkout instead of the pinned one
#   WARMCTX_CUDA=1      build llama.cpp with CUDA (sm_90 unless CMAKE_CUDA_ARCHITECTURES is set)
#   WARMCTX_JOBS        parallel build jobs (default: all cores)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${WARMCTX_BUILD_DIR:-build}"
jobs="${WARMCTX_JOBS:-$(nproc)}"

# --- Debian packages ---------------------------------------------------------
pkgs=(build-essential cmake ninja-build ccache git openssl ca-certificates
      pkg-config libxxhash-dev nlohmann-json3-dev libsimdjson-dev libcli11-dev libgtest-dev libgmock-dev
      libcpp-httplib-dev jq gnuplot-nox haproxy chromium
      clang libclang-rt-dev)  # the libFuzzer harnesses (scripts/fuzz.sh); libFuzzer is in libclang-rt-dev
# chromium: the page at /ui is tested in a real browser, headless (tests/server/ui_page.sh)
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- llama.cpp -----------------------------------------------------------------
llama_dir="${WARMCTX_LLAMA_DIR:-$root/third_party/llama.cpp}"
if [ -z "${WARMCTX_LLAMA_DIR:-}" ]; then
  bash "$root/scripts/fetch-llama.sh" "$llama_dir"
fi

# --- build ---------------------------------------------------------------------
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI)
# reuses the objects of an earlier build of the same llama.cpp.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
cmake_args=(-DWARMCTX_LLAMA_DIR="$llama_dir" -DCMAKE_BUILD_TYPE=Release)
[ "${WARMCTX_CUDA:-0}" = 1 ] && cmake_args+=(-DWARMCTX_CUDA=ON)
if [ ! -f "$build/CMakeCache.txt" ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" "${cmake_args[@]}"
else
  cmake -S . -B "$build" "${cmake_args[@]}" >/dev/null
fi
echo "setup: building ($jobs jobs; llama.cpp's first build takes several minutes, ccache makes later ones fast)"
cmake --build "$build" -j "$jobs"
echo "setup: done; the binary is $build/warmctx"
