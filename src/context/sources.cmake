# The context module: segments, kind table, canonical assembly, manifest, profile.
set(WARMCTX_CONTEXT_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/segments.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kind_table.cpp
  ${CMAKE_CURRENT_LIST_DIR}/assembler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile.cpp
)
