// [K8]: a translation unit that includes both Asio front ends must not
// compile (tests/async/CMakeLists.txt builds it expecting the #error).
// The order is the test: clang-format would sort it.
// clang-format off
#ifdef BULKHEAD_TEST_BOOST_FIRST
#include <bulkhead/boost_asio.hpp>
#include <bulkhead/asio.hpp>
#else
#include <bulkhead/asio.hpp>
#include <bulkhead/boost_asio.hpp>
#endif
// clang-format on
