// bulkhead: admission control in front of a PostgreSQL connection pool.
//
// The one place where the library's version is written. CMake reads it from
// here (see the top-level CMakeLists.txt), so the package version, the
// headers and the documentation cannot disagree.
#pragma once

#define BULKHEAD_VERSION_MAJOR 0
#define BULKHEAD_VERSION_MINOR 1
#define BULKHEAD_VERSION_PATCH 0

namespace bulkhead {

/// The library version as "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";

}  // namespace bulkhead
