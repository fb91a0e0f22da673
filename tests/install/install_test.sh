#!/usr/bin/env bash
# cmake --install puts a working warmctx under a prefix that can be moved: the binary
# finds its vocabulary and tools relative to itself (not through the source or build
# tree), the notices are there, and a consumer project builds against the installed
# library with find_package(warmctx) and runs it on a model the installed binary made.
set -euo pipefail
build="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
mv "$tmp/prefix" "$tmp/moved"      # relocated: no path of the install step is valid now
p="$tmp/moved"
for f in bin/warmctx bin/warmctx-bench libexec/warmctx/llama-server libexec/warmctx/llama-bench share/warmctx/ggml-vocab-qwen2.gguf \
         share/warmctx/qwen2.5-chat-template.jinja share/warmctx/Qwen3.5-4B.jinja share/warmctx/openai-gpt-oss-120b.jinja share/warmctx/Qwen3-Coder.jinja \
         share/doc/warmctx/THIRD_PARTY_NOTICES.md share/doc/warmctx/LICENSE share/doc/warmctx/licenses/llama.cpp.LICENSE \
         include/warmctx/engine.h lib/warmctx/libwarmctx_runtime.a lib/warmctx/libllama.a lib/cmake/warmctx/warmctxConfig.cmake; do
  [ -e "$p/$f" ] || { echo "missing after install: $f"; exit 1; }
done
# The binary's resources are the moved prefix's, not the source or build tree's.
"$p/bin/warmctx" make-model --help | grep -q "default: $p/bin/../share/warmctx/ggml-vocab-qwen2.gguf" ||
  { echo "the default vocabulary is not the prefix's:"; "$p/bin/warmctx" make-model --help | grep -i vocab; exit 1; }
# warmctx-bench runs the prefix's llama.cpp tools.
"$p/bin/warmctx-bench" engine --help | grep -q -- "--llama-bench TEXT=$p/bin/../libexec/warmctx/llama-bench" ||
  { echo "warmctx-bench's default llama-bench is not the prefix's:"; "$p/bin/warmctx-bench" engine --help | grep -- --llama-bench; exit 1; }
env -i PATH=/usr/bin:/bin HOME="$tmp" "$p/bin/warmctx" make-model --shape tiny --type f16 --seed 3 -o "$tmp/m.gguf" >/dev/null
[ -s "$tmp/m.gguf" ] || { echo "the moved binary did not make a model"; exit 1; }
# A consumer of the library.
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.22)
project(consumer CXX)
find_package(warmctx CONFIG REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE warmctx::warmctx)
CM
cat > "$tmp/consumer/main.cpp" <<'CPP'
#include <cstdio>
#include "warmctx/chunking.h"
#include "warmctx/engine.h"
#include "warmctx/json.h"
int main(int argc, char ** argv) {
    auto chunks = warmctx::plan_chunks(0, 10, {}, 4);
    auto j = warmctx::parse_json("{\"ok\": true}");
    auto info = warmctx::read_model_info(argv[1]);
    if (argc < 2 || chunks.size() != 3 || !j.ok() || !info.ok()) return 1;
    std::printf("consumer: %s, %d layers\n", info->architecture.c_str(), info->n_layer);
    return 0;
}
CPP
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer/build" -j 2 >/dev/null
"$tmp/consumer/build/consumer" "$tmp/m.gguf"
echo "install test passed"
