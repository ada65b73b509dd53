// admission_counter: immediate, lock-free, exact.
#include "test_util.hpp"

#include <bulkhead/admission_counter.hpp>

#include "catch.hpp"

#include <atomic>
#include <thread>
#include <type_traits>
#include <vector>

using bulkhead::admission_counter;

static_assert(noexcept(std::declval<admission_counter&>().try_acquire()));
static_assert(noexcept(std::declval<admission_counter&>().release()));
static_assert(std::atomic<std::int64_t>::is_always_lock_free, "the reject path must be lock-free");

TEST_CASE("admission_counter hands out exactly its capacity", "[counter]") {
    const int capacity = GENERATE(0, 1, 5);
    admission_counter slots(capacity);
    CHECK(slots.capacity() == capacity);
    for (int i = 0; i < capacity; ++i) {
        REQUIRE(slots.try_acquire());
    }
    CHECK_FALSE(slots.try_acquire());
    CHECK_FALSE(slots.try_acquire());
    CHECK(slots.available() == 0);
    for (int i = 0; i < capacity; ++i) {
        slots.release();
    }
    CHECK(slots.available() == capacity);
}

TEST_CASE("admission_counter rejects a negative or oversized capacity", "[counter]") {
    CHECK_THROWS_AS(admission_counter(-1), std::invalid_argument);
    CHECK_THROWS_AS(admission_counter(admission_counter::max_capacity + 1), std::invalid_argument);
}

TEST_CASE("admission_counter, concurrent callers never take more than the capacity", "[counter][stress]") {
    admission_counter slots(3);
    std::atomic<int> holding{0};
    std::atomic<int> most{0};
    std::atomic<long> rejected{0};
    std::vector<std::thread> threads;
    threads.reserve(8);
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 20000; ++i) {
                if (!slots.try_acquire()) {
                    ++rejected;
                    continue;
                }
                bulkhead_test::raise_max(most, ++holding);
                --holding;
                slots.release();
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(most.load() <= 3);
    CHECK(slots.available() == 3);
}
