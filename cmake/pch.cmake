# Precompiled headers (docs/development.md). Parsing the standard library, nlohmann/json and fmt
# costs 2-3 s in each translation unit, CLI11 4 s more; a precompiled header parses them once.
#   concord_pch      built once, reused (REUSE_FROM) by the libraries from io up, which compile
#                    with the same flags: GCC accepts a .gch only under the flags and macros it was
#                    made with, and CMake's -Winvalid-pch (an error under -Werror) fails the build
#                    rather than let a refused header go unnoticed;
#   the concord binary's own, with CLI11 as well (the one target that includes it).
# numerics and tensor (SIMD sources with their own -m flags, few heavy includes) and the tests go
# without: measured, a test translation unit gained 6% from a header with gtest (its time is
# code generation, not parsing), and GCC 12 reports its std::string false positives
# (-Wstringop-overflow, GCC bug 105329) from inside a precompiled header, where a plainly
# included system header keeps them quiet; the four library sites that tripped it are written
# so that they do not. Force-including these headers changes no meaning: they are system headers
# with include guards, and no source defines a macro they read before including them.
# CONCORD_PCH=OFF builds without them.
option(CONCORD_PCH "Precompiled headers for the libraries and the CLI" ON)

set(CONCORD_PCH_STD <algorithm> <array> <cmath> <cstdint> <cstring> <filesystem> <functional>
  <map> <memory> <optional> <set> <span> <stdexcept> <string> <string_view> <unordered_map>
  <utility> <vector>)
set(CONCORD_PCH_LIB ${CONCORD_PCH_STD} <nlohmann/json.hpp> <fmt/format.h>)

if(CONCORD_PCH)
  set(concord_pch_source ${CMAKE_BINARY_DIR}/concord_pch.cpp)
  if(NOT EXISTS ${concord_pch_source})
    file(WRITE ${concord_pch_source} "// The translation unit that builds a precompiled header.\n")
  endif()
  add_library(concord_pch OBJECT ${concord_pch_source})
  target_link_libraries(concord_pch PRIVATE concord_warnings OpenMP::OpenMP_CXX fmt::fmt
    nlohmann_json::nlohmann_json)
  target_precompile_headers(concord_pch PRIVATE ${CONCORD_PCH_LIB})
endif()

# concord_use_pch(<target>): the libraries' shared precompiled header for a library.
function(concord_use_pch target)
  if(NOT CONCORD_PCH)
    return()
  endif()
  # The users compile with fmt's definitions (FMT_SHARED), as the header was made: GCC refuses a
  # .gch under other macros that its headers read (-Winvalid-pch, an error here).
  target_link_libraries(${target} PRIVATE fmt::fmt nlohmann_json::nlohmann_json)
  target_precompile_headers(${target} REUSE_FROM concord_pch)
endfunction()

# concord_add_test_pch(): the tests' header (std, json, fmt, gtest), built by an executable as the
# tests are (GCC refuses a -fPIC header in a -fPIE compile) with their flags and gtest's macros.
function(concord_add_test_pch)
  if(NOT CONCORD_PCH)
    return()
  endif()
  set(main ${CMAKE_BINARY_DIR}/concord_test_pch_main.cpp)
  if(NOT EXISTS ${main})
    file(WRITE ${main} "// Builds the tests' precompiled header.\nint main() { return 0; }\n")
  endif()
  add_executable(concord_test_pch ${main})
  target_link_libraries(concord_test_pch PRIVATE concord_test_warnings OpenMP::OpenMP_CXX
    GTest::gtest fmt::fmt nlohmann_json::nlohmann_json)
  target_precompile_headers(concord_test_pch PRIVATE ${CONCORD_PCH_LIB} <gtest/gtest.h>)
endfunction()

# concord_use_test_pch(<target>): a test executable that links GoogleTest reuses it.
function(concord_use_test_pch target)
  if(NOT CONCORD_PCH)
    return()
  endif()
  target_link_libraries(${target} PRIVATE fmt::fmt nlohmann_json::nlohmann_json GTest::gtest)
  target_precompile_headers(${target} REUSE_FROM concord_test_pch)
endfunction()
