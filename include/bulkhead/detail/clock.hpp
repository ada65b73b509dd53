// bulkhead: steady_clock arithmetic that never overflows.
//
// Relative waits given by users (milliseconds up to their type's maximum)
// become absolute steady_clock deadlines here; the sums saturate at
// time_point::max() ("no deadline") instead of wrapping around. Lifetimes
// get their jitter here too.
#pragma once

#include <chrono>
#include <cstdint>

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

/// `lifetime` shortened by a random part of up to 1/40 of it (2.5 %, as
/// HikariCP does for maxLifetime), so that connections opened together do
/// not all retire together: in [lifetime - lifetime / 40, lifetime], drawn
/// from `random` (any uniformly random 64-bit number). Zero stays zero.
[[nodiscard]] constexpr std::chrono::milliseconds jittered_lifetime(std::chrono::milliseconds lifetime,
                                                                    std::uint64_t random) noexcept {
    const std::int64_t range = lifetime.count() / 40;
    if (range <= 0) {
        return lifetime;
    }
    return lifetime -
           std::chrono::milliseconds(static_cast<std::int64_t>(random % static_cast<std::uint64_t>(range + 1)));
}

}  // namespace bulkhead::detail
