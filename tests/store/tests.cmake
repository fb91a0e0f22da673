# Tests of the store module (included from tests/CMakeLists.txt).
#
# Unit (no model): the file-system seam, the snapshot format, the snapshot store and the
# store under injected faults and crashes, all on the in-memory and fault-injecting fs.
add_executable(warmctx_store_tests
  ${CMAKE_CURRENT_LIST_DIR}/fs_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/snapshot_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/snapshot_store_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_faults_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/disk_room_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shared_dir_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/volatility_store_test.cpp
)
target_link_libraries(warmctx_store_tests PRIVATE warmctx_store GTest::gtest_main)
gtest_discover_tests(warmctx_store_tests PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)

# The crash loop (label model): a child computes a real KV on the tiny model and writes
# snapshots through the real fs; the parent SIGKILLs it 30 times, then checks every file
# and restores each one against a cold run. It leaves its directory for the CLI tests.
add_executable(warmctx_store_crash_tests ${CMAKE_CURRENT_LIST_DIR}/crash_loop_test.cpp)
target_link_libraries(warmctx_store_crash_tests PRIVATE warmctx_store warmctx_engine GTest::gtest_main)
target_compile_definitions(warmctx_store_crash_tests PRIVATE
  WARMCTX_TINY_MODEL="${WARMCTX_TINY_MODEL}"
  WARMCTX_TEST_TMP="${WARMCTX_TEST_MODEL_DIR}")
gtest_discover_tests(warmctx_store_crash_tests
  PROPERTIES LABELS model FIXTURES_REQUIRED tiny_model FIXTURES_SETUP crash_loop_snapshots
  TIMEOUT 120 DISCOVERY_TIMEOUT 60)

# warmctx snapshot: on the crash loop's directory every file verifies; a foreign file in a
# directory is named, with its reason, and makes verify exit non-zero.
add_test(NAME cli_snapshot_verify_crash_loop_dir
  COMMAND bash ${WARMCTX_EXPECT} 0 "[1-9][0-9]* ok, 0 bad" $<TARGET_FILE:warmctx> snapshot verify --cache-dir ${WARMCTX_TEST_MODEL_DIR}/crash-loop-snapshots)
set_tests_properties(cli_snapshot_verify_crash_loop_dir PROPERTIES LABELS model
  FIXTURES_REQUIRED crash_loop_snapshots)
add_test(NAME cli_snapshot_ls_crash_loop_dir
  COMMAND bash ${WARMCTX_EXPECT} 0 "\"workspace\": \"ws[01]\"" $<TARGET_FILE:warmctx> snapshot ls --json --cache-dir ${WARMCTX_TEST_MODEL_DIR}/crash-loop-snapshots)
set_tests_properties(cli_snapshot_ls_crash_loop_dir PROPERTIES LABELS model
  FIXTURES_REQUIRED crash_loop_snapshots)
add_test(NAME cli_snapshot_verify_names_a_bad_file
  COMMAND bash ${WARMCTX_EXPECT} 0 "BAD foreign\\.wcsnap: bad_magic.*0 ok, 1 bad.*exit=1" sh -c "d=$(mktemp -d) && printf 'not a snapshot' > $d/foreign.wcsnap && $<TARGET_FILE:warmctx> snapshot verify --cache-dir $d; echo exit=$?; rm -rf $d")
set_tests_properties(cli_snapshot_verify_names_a_bad_file PROPERTIES LABELS unit)
add_test(NAME cli_snapshot_ls_missing_dir
  COMMAND bash ${WARMCTX_EXPECT} 2 "error: snapshot directory .* does not exist" $<TARGET_FILE:warmctx> snapshot ls --cache-dir ${WARMCTX_TEST_MODEL_DIR}/no-such-snapshot-dir)
set_tests_properties(cli_snapshot_ls_missing_dir PROPERTIES LABELS unit)
