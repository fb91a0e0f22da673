# warmctx_library(NAME SOURCES ... DEPENDS ...)
#
# One static library per folder of src/. Its public headers are include/warmctx/ (the
# whole public API, one directory, all of it installed); src/ is a PRIVATE include
# directory, so that the headers of a folder that a later layer uses, private to the
# project, are included by their layer's name ("util/clock.h", "store/snapshot_store.h");
# its own folder is a PRIVATE include directory too, so a folder's internal headers
# ("prefix_index.h") are included by their name alone. Neither is ever on the INTERFACE
# of a library, nor installed. DEPENDS lists the warmctx libraries below it in the
# chain, linked PRIVATE: a library gets exactly the layers it names, and
# scripts/check-layers.sh (run by every build) refuses an include of a layer it may not
# use.
function(warmctx_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPENDS;PUBLIC_DEPENDS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  # nlohmann/json is the one third-party header the public API hands out.
  target_link_libraries(${name} PRIVATE ${A_DEPENDS} PUBLIC nlohmann_json::nlohmann_json ${A_PUBLIC_DEPENDS})
  target_compile_options(${name} PRIVATE -Wall -Wextra)
endfunction()
