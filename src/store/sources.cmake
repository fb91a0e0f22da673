# The store module: file-system seam (posix, in-memory, fault-injecting), the snapshot
# file format and the snapshot store (the disk tier). Links warmctx_core only.
set(WARMCTX_STORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/fs_posix.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fs_mem.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fs_faulty.cpp
  ${CMAKE_CURRENT_LIST_DIR}/snapshot.cpp
  ${CMAKE_CURRENT_LIST_DIR}/snapshot_store.cpp
)
