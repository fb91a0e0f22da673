# Unit tests of the cache module on a fake engine (no model, no llama.cpp).
set(WARMCTX_CACHE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_test.cpp
)
