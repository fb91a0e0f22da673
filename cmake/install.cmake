# cmake --install: the warmctx command, the benchmarks' warmctx-bench, what they need at
# run time, the C++ library and a CMake package config, and the notices of the third-party
# code built in.
#
#   bin/warmctx, bin/warmctx-bench
#   libexec/warmctx/llama-server, llama-bench     (the side-by-side benchmarks run them)
#   share/warmctx/ggml-vocab-qwen2.gguf           (embedded in generated models)
#   share/warmctx/*.jinja                         (their chat templates, one per family)
#   share/doc/warmctx/                            LICENSE, THIRD_PARTY_NOTICES.md, licenses
#   include/warmctx/*.h (what an embedder uses), lib/warmctx/*.a, lib/cmake/warmctx/warmctxConfig.cmake
#
# The binaries find share/ and libexec/ relative to themselves (src/util/resources.h), so
# the prefix can be moved; warmctx-bench sits beside warmctx so that both find the same.
include(GNUInstallDirs)

install(TARGETS warmctx warmctx-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS $<TARGET_FILE:llama-server> $<TARGET_FILE:llama-bench>
        DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/warmctx)
install(FILES ${PROJECT_BINARY_DIR}/share/warmctx/ggml-vocab-qwen2.gguf
              ${PROJECT_BINARY_DIR}/share/warmctx/qwen2.5-chat-template.jinja
              ${PROJECT_BINARY_DIR}/share/warmctx/Qwen3.5-4B.jinja
              ${PROJECT_BINARY_DIR}/share/warmctx/openai-gpt-oss-120b.jinja
              ${PROJECT_BINARY_DIR}/share/warmctx/Qwen3-Coder.jinja
              ${PROJECT_BINARY_DIR}/share/warmctx/LFM2.5-Instruct.jinja
        DESTINATION ${CMAKE_INSTALL_DATADIR}/warmctx)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/THIRD_PARTY_NOTICES.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${WARMCTX_LLAMA_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR}/licenses RENAME llama.cpp.LICENSE)
foreach(pair "libcli11-dev:CLI11" "nlohmann-json3-dev:nlohmann-json" "libcpp-httplib-dev:cpp-httplib" "libxxhash-dev:xxhash")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 pkg)
  list(GET pair 1 name)
  if(EXISTS /usr/share/doc/${pkg}/copyright)
    install(FILES /usr/share/doc/${pkg}/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR}/licenses RENAME ${name}.copyright)
  endif()
endforeach()

# The library: every layer but the command line, the HTTP server included, and the
# llama.cpp libraries they link, as one imported target warmctx::warmctx.
# warmctx_chat and llama.cpp's llama-common (the chat templates) sit between the engine
# and the layers below it; llama-common's own HTTP client (model downloads, unused here)
# comes last.
set(WARMCTX_LIB_TARGETS warmctx_server warmctx_runtime warmctx_workload warmctx_engine warmctx_chat llama-common
    llama-common-base warmctx_store warmctx_cache warmctx_context warmctx_util llama ggml ggml-cpu ggml-base
    cpp-httplib)
if(WARMCTX_CUDA)
  list(INSERT WARMCTX_LIB_TARGETS 14 ggml-cuda)
endif()
# The cpp-httplib the server was built against: Debian's (found by pkg-config) is linked
# right after the server, so that llama.cpp's vendored one, last in the list, does not
# take its place; the vendored fallback (warmctx_httplib) is that last one already.
set(WARMCTX_SERVER_HTTPLIB "")
if(NOT TARGET warmctx_httplib)
  set(WARMCTX_SERVER_HTTPLIB cpp-httplib)
endif()
set(WARMCTX_LIB_FILES "")
foreach(t ${WARMCTX_LIB_TARGETS})
  install(FILES $<TARGET_FILE:${t}> DESTINATION ${CMAKE_INSTALL_LIBDIR}/warmctx)
  list(APPEND WARMCTX_LIB_FILES "lib${t}.a")
endforeach()
# The headers an embedder uses - the server, the scheduler, the context engine, the
# engine, the file system seam, status, their options and reports - and the ones they
# include: every header of include/warmctx/. The headers that serve warmctx's own layers
# are in src/<layer>/ and not installed, and no header here includes one
# (scripts/check-layers.sh refuses it). tests/install/install_test.sh compiles every
# installed header on its own.
set(WARMCTX_INSTALLED_HEADERS
    server scheduler context_engine context_options context_counters explain_report engine fs status
    # what those include
    assembler chat_template chunking conversation drafts eviction_policy hash kind_table manifest
    prefix_cache profile sampling segments text_model types volatility)
list(TRANSFORM WARMCTX_INSTALLED_HEADERS REPLACE "(.+)" "${PROJECT_SOURCE_DIR}/include/warmctx/\\1.h")
file(GLOB WARMCTX_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/warmctx/*.h)
foreach(h ${WARMCTX_PUBLIC_HEADERS})
  if(NOT h IN_LIST WARMCTX_INSTALLED_HEADERS)
    message(FATAL_ERROR "${h} is public but not installed: add it to WARMCTX_INSTALLED_HEADERS, or move it to "
                        "the folder of its layer under src/ (CONTRIBUTING.md, Layers)")
  endif()
endforeach()
install(FILES ${WARMCTX_INSTALLED_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/warmctx)
configure_file(${PROJECT_SOURCE_DIR}/cmake/warmctxConfig.cmake.in ${PROJECT_BINARY_DIR}/warmctxConfig.cmake @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/warmctxConfig.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/warmctx)
