# Hardening builds: sanitizers and libFuzzer (docs/hardening.md).
#
# Included by the top-level CMakeLists.txt after llama.cpp's add_subdirectory, so the
# directory-scoped options below reach warmctx's own code (src/, tests/, fuzz/) and never
# llama.cpp: its objects stay those of a plain build (and ccache's copies of them serve).
#
#   -DWARMCTX_SANITIZE=address,undefined   our libraries and tests under ASan+UBSan
#                                         (scripts/sanitize.sh; gcc or clang)
#   -DWARMCTX_FUZZ=ON                      the harnesses of fuzz/, our libraries with
#                                         libFuzzer's coverage, ASan and UBSan
#                                         (scripts/fuzz.sh; clang only)
#
# Every finding aborts (no recovery), so a test or a fuzz run cannot pass over one.

if(WARMCTX_SANITIZE)
  message(STATUS "warmctx: sanitizers ${WARMCTX_SANITIZE} for warmctx's own code")
  add_compile_options(-fsanitize=${WARMCTX_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
  add_link_options(-fsanitize=${WARMCTX_SANITIZE})
endif()

if(WARMCTX_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "WARMCTX_FUZZ needs clang and its libFuzzer: configure with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
  endif()
  if(WARMCTX_SANITIZE)
    message(FATAL_ERROR "WARMCTX_FUZZ brings its own sanitizers; leave WARMCTX_SANITIZE empty")
  endif()
  # Coverage for the fuzzer in every warmctx object; the harnesses link libFuzzer itself
  # (-fsanitize=fuzzer, fuzz/CMakeLists.txt).
  set(WARMCTX_FUZZ_SANITIZERS "address,undefined" CACHE STRING
      "Sanitizers of the fuzzing build (undefined alone runs about twice as fast)")
  add_compile_options(-fsanitize=fuzzer-no-link,${WARMCTX_FUZZ_SANITIZERS} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${WARMCTX_FUZZ_SANITIZERS})
endif()
