// The one Catch2 v2 main shared by every test executable (tests/CMakeLists.txt
// compiles it only for Catch2 v2; on v3 the tests link Catch2::Catch2WithMain).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
