// Contract K, the parts that need no database: the jitter on a connection's
// lifetime (K3).
#include <bulkhead/detail/clock.hpp>

#include "catch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

using namespace std::chrono_literals;

TEST_CASE("[K3] max_lifetime is jittered: up to 2.5 % shorter, never longer, spread across the range", "[K3]") {
    using bulkhead::detail::jittered_lifetime;
    const std::chrono::milliseconds lifetime = 1800s;  // the pool's default
    const std::chrono::milliseconds shortest = lifetime - lifetime / 40;
    CHECK(jittered_lifetime(lifetime, 0) == lifetime);
    CHECK(jittered_lifetime(lifetime, static_cast<std::uint64_t>(lifetime.count() / 40)) == shortest);
    CHECK(jittered_lifetime(lifetime, UINT64_MAX) >= shortest);
    // Zero (never) and lifetimes too short for a whole millisecond of jitter
    // stay as they are.
    CHECK(jittered_lifetime(0ms, 12345) == 0ms);
    CHECK(jittered_lifetime(39ms, 12345) == 39ms);
    // Drawn from random numbers: every draw in range, the draws spread over
    // it (16 connections opened at once retire over about a minute).
    std::mt19937_64 random(7);
    std::chrono::milliseconds low = lifetime;
    std::chrono::milliseconds high = 0ms;
    for (int i = 0; i < 16; ++i) {
        const std::chrono::milliseconds drawn = jittered_lifetime(lifetime, random());
        CHECK(drawn >= shortest);
        CHECK(drawn <= lifetime);
        low = std::min(low, drawn);
        high = std::max(high, drawn);
    }
    CHECK(high - low > lifetime / 80);
}
