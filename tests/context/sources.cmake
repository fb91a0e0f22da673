# Unit tests of the context module: no model, no llama.cpp.
set(WARMCTX_CONTEXT_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/segments_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kind_table_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/assembler_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manifest_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile_test.cpp
)
