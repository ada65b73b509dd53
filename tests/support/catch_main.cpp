// Catch2 v2's runner, for a build with libc++ only: every other build links
// Catch2::Catch2WithMain, the runner Debian ships built against libstdc++
// (tests/CMakeLists.txt).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
