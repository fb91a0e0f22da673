#!/usr/bin/env bash
# cmake --install puts a working warmctx under a prefix that can be moved: the binary
# finds its vocabulary and tools relative to itself (not through the source or build
# tree), the notices are there, and a consumer project builds against the installed
# library with find_package(warmctx) and runs it on a model the installed binary made,
# and serves HTTP with the installed server. Only the headers an embedder uses are
# installed, and each of them compiles on its own.
set -euo pipefail
build="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
mv "$tmp/prefix" "$tmp/moved"      # relocated: no path of the install step is valid now
p="$tmp/moved"
for f in bin/warmctx bin/warmctx-bench libexec/warmctx/llama-server libexec/warmctx/llama-bench share/warmctx/ggml-vocab-qwen2.gguf \
         share/warmctx/qwen2.5-chat-template.jinja share/warmctx/Qwen3.5-4B.jinja share/warmctx/openai-gpt-oss-120b.jinja share/warmctx/Qwen3-Coder.jinja \
         share/doc/warmctx/THIRD_PARTY_NOTICES.md share/doc/warmctx/LICENSE share/doc/warmctx/licenses/llama.cpp.LICENSE \
         include/warmctx/engine.h include/warmctx/server.h lib/warmctx/libwarmctx_server.a lib/warmctx/libwarmctx_runtime.a lib/warmctx/libllama.a lib/cmake/warmctx/warmctxConfig.cmake; do
  [ -e "$p/$f" ] || { echo "missing after install: $f"; exit 1; }
done
# What warmctx's own layers use, and no embedder needs, is not installed.
for f in include/warmctx/verify.h include/warmctx/snapshot_store.h include/warmctx/json.h include/warmctx/model_maker.h; do
  [ ! -e "$p/$f" ] || { echo "installed, though no embedder needs it: $f"; exit 1; }
done
echo "installed headers: $(ls "$p/include/warmctx" | wc -l)"
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
# every installed header on its own: the installed set includes nothing it lacks
file(GLOB headers "${warmctx_DIR}/../../../include/warmctx/*.h")
foreach(h ${headers})
  get_filename_component(name "${h}" NAME_WE)
  file(WRITE "${CMAKE_BINARY_DIR}/alone/${name}.cpp" "#include \"warmctx/${name}.h\"\n")
  list(APPEND alone "${CMAKE_BINARY_DIR}/alone/${name}.cpp")
endforeach()
add_library(headers_alone OBJECT ${alone})
target_link_libraries(headers_alone PRIVATE warmctx::warmctx)
CM
cat > "$tmp/consumer/main.cpp" <<'CPP'
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "warmctx/chunking.h"
#include "warmctx/engine.h"
#include "warmctx/server.h"

// GET /health from the server on 127.0.0.1:port; the status line.
static std::string get_health(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string got;
    if (fd >= 0 && connect(fd, (sockaddr *)&a, sizeof a) == 0) {
        const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            char buf[512];
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) > 0) got.append(buf, (size_t)n);
        }
    }
    if (fd >= 0) close(fd);
    return got.substr(0, got.find("\r\n"));
}

int main(int argc, char ** argv) {
    auto chunks = warmctx::plan_chunks(0, 10, {}, 4);
    auto info = warmctx::read_model_info(argv[1]);
    if (argc < 2 || chunks.size() != 3 || !info.ok()) return 1;
    std::printf("consumer: %s, %d layers\n", info->architecture.c_str(), info->n_layer);
    // The server before a scheduler is attached: /health says it is loading.
    warmctx::server_options opts;
    opts.port = 0;
    opts.log_requests = false;
    auto server = warmctx::http_server::start(opts);
    if (!server.ok()) return 2;
    const std::string line = get_health((*server)->port());
    (*server)->stop();
    std::printf("consumer: GET /health before attach: %s\n", line.c_str());
    return line.find(" 503") != std::string::npos ? 0 : 3;
}
CPP
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer/build" -j 2 >/dev/null
"$tmp/consumer/build/consumer" "$tmp/m.gguf"
echo "install test passed"
