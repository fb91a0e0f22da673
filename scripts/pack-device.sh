#!/usr/bin/env bash
# Packs what a machine without Debian's packages or network needs to build warmctx
# and llama.cpp (scripts/bench-h200.sh): the pinned llama.cpp sources as an archive
# (with its commit in LLAMA_COMMIT), the header-only libraries warmctx uses that
# llama.cpp does not vendor (CLI11, xxHash), and Debian's simdjson (its header and its
# shared library, which needs nothing newer than glibc 2.14). Output: .devcarry/ (git-ignored).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
llama="${WARMCTX_LLAMA_DIR:-$root/third_party/llama.cpp}"
[ -d "$llama/.git" ] || bash scripts/fetch-llama.sh
commit="$(git -C "$llama" rev-parse HEAD)"
rm -rf .devcarry && mkdir -p .devcarry/include
# Only the Qwen2 vocab of models/ is needed (make-model reads it).
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
git -C "$llama" archive --format=tar HEAD -- . ':!models/*.gguf' ':!docs' ':!examples' ':!media' >"$tmp/src.tar"
mkdir -p "$tmp/extra/models"
cp "$llama/models/ggml-vocab-qwen2.gguf" "$tmp/extra/models/"
echo "$commit" >"$tmp/extra/LLAMA_COMMIT"
tar -rf "$tmp/src.tar" -C "$tmp/extra" LLAMA_COMMIT models/ggml-vocab-qwen2.gguf
gzip -6 <"$tmp/src.tar" >.devcarry/llama-src.tar.gz
cp -r /usr/include/CLI .devcarry/include/
cp /usr/include/xxhash.h .devcarry/include/
[ -f /usr/include/xxh3.h ] && cp /usr/include/xxh3.h .devcarry/include/
cp /usr/include/simdjson.h .devcarry/include/
mkdir -p .devcarry/lib
cp -L /usr/lib/x86_64-linux-gnu/libsimdjson.so.14 .devcarry/lib/
du -sh .devcarry
echo "pack-device: llama.cpp $commit packed into .devcarry/"
