# warmctx_library(NAME SOURCES ... DEPENDS ...)
#
# One static library per folder of src/. Its public headers are include/warmctx/ (the
# whole public API, one directory); its own folder is a PRIVATE include directory, so a
# folder's internal headers ("prefix_index.h") are seen by that folder alone. DEPENDS
# lists the warmctx libraries below it in the chain, linked PRIVATE: a library gets
# exactly the layers it names, and scripts/check-layers.sh (run by every build) refuses
# an include of a layer it may not use.
function(warmctx_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPENDS;PUBLIC_DEPENDS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  # nlohmann/json is the one third-party header the public API hands out.
  target_link_libraries(${name} PRIVATE ${A_DEPENDS} PUBLIC nlohmann_json::nlohmann_json ${A_PUBLIC_DEPENDS})
  target_compile_options(${name} PRIVATE -Wall -Wextra)
endfunction()
