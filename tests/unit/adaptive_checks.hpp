// What the G7 gate tests (tests/unit/adaptive_limit_test.cpp, threads;
// tests/async/async_test.cpp, coroutine callers) check once their callers
// are done: the limit moved, never more than B callbacks ran, and every
// permit and slot is back.
#pragma once

#include <bulkhead/gate_stats.hpp>

#include "catch.hpp"

namespace bulkhead_test {

/// `most`: the most callbacks seen running at once; `limit`: gate.limit().
inline void check_every_permit_back(const bulkhead::gate_stats& stats, int limit, int most, int ceiling,
                                    int extra_slots) {
    CHECK(most <= ceiling);
    CHECK(stats.limit_changes >= 2);
    CHECK(stats.running == 0);
    CHECK(stats.queued == 0);
    CHECK(stats.available == limit);
    CHECK(stats.available_slots == ceiling + extra_slots);
    CHECK(stats.admitted == stats.completed);
}

}  // namespace bulkhead_test
