// catch.hpp: the one Catch2 include of every test, for Catch2 v2 (Debian 12:
// 2.13, the single header catch2/catch.hpp) and Catch2 v3 (Debian 13: 3.7,
// one header per part).
//
// The tests are written in v3's spellings; on v2 this header adds the ones v2
// spells differently, each as a plain alias of v2's own:
//
//   Catch::Matchers::ContainsSubstring   v2: Catch::Matchers::Contains (for strings)
//   Catch::Approx                        v2: Catch::Detail::Approx (global Approx)
//
// Catch::Matchers::StartsWith, EndsWith, Equals and Message are spelled the
// same in both. tests/CMakeLists.txt defines BULKHEAD_CATCH2_MAJOR from the
// Catch2 that find_package found and links the matching main
// (tests/support/catch_main.cpp on v2, Catch2::Catch2WithMain on v3).
#pragma once

#ifndef BULKHEAD_CATCH2_MAJOR
#error "BULKHEAD_CATCH2_MAJOR is not defined: link the test to bulkhead_catch_main (tests/CMakeLists.txt)"
#endif

#if BULKHEAD_CATCH2_MAJOR >= 3

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#else

#include <catch2/catch.hpp>

#include <string>

namespace Catch {  // NOLINT(readability-identifier-naming): Catch2's own namespace
/// v3's name for the floating-point comparison helper.
using Detail::Approx;

namespace Matchers {
/// v3's name for the substring matcher (v3's Contains matches range elements).
[[nodiscard]] inline StdString::ContainsMatcher ContainsSubstring(  // NOLINT(readability-identifier-naming)
    const std::string& needle, CaseSensitive::Choice case_sensitivity = CaseSensitive::Yes) {
    return Contains(needle, case_sensitivity);
}
}  // namespace Matchers
}  // namespace Catch

#endif
