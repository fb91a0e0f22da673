# The cache module: prefix index (trie of cached blocks + holders + accounting) and the
# prefix cache (eviction policy, budgets, plan/apply onto the engine through kv_ops).
set(WARMCTX_CACHE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index.cpp
  ${CMAKE_CURRENT_LIST_DIR}/prefix_cache.cpp
)
