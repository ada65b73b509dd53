// bulkhead: steady_clock arithmetic that never overflows.
//
// Relative waits given by users (milliseconds up to their type's maximum)
// become absolute steady_clock deadlines here; the sums saturate at
// time_point::max() ("no deadline") instead of wrapping around.
#pragma once

#include <chrono>

namespace bulkhead::detail {

/// `now + duration`, or time_point::max() when that does not fit.
[[nodiscard]] inline std::chrono::steady_clock::time_point saturating_add(std::chrono::steady_clock::time_point now,
                                                                          std::chrono::milliseconds duration) noexcept {
    using std::chrono::steady_clock;
    if (duration > std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::time_point::max() - now)) {
        return steady_clock::time_point::max();
    }
    return now + duration;
}

/// Whole milliseconds from `from` to `to` (never overflows a comparison
/// with a user's milliseconds value).
[[nodiscard]] inline std::chrono::milliseconds elapsed_ms(std::chrono::steady_clock::time_point from,
                                                          std::chrono::steady_clock::time_point to) noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(to - from);
}

}  // namespace bulkhead::detail
