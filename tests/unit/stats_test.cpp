// gate.stats(): every counter moves exactly when its outcome happens, one
// test per outcome, over the test-double pool.
#include "fake_pool.hpp"
#include "gate_blocker.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>

#include "catch.hpp"

#include <future>
#include <latch>
#include <stop_token>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using bulkhead::reject_reason;
using bulkhead_test::fake_pool;
using gate_t = bulkhead::db_bulkhead<fake_pool>;

namespace {

/// Counters that must not have moved, besides the ones a test expects.
struct expected_counts {
    std::uint64_t admitted = 0;
    std::array<std::uint64_t, bulkhead::reject_reason_count> rejected{};
    std::uint64_t completed = 0;
    std::uint64_t failed = 0;
    std::uint64_t work_cancelled = 0;
    std::uint64_t work_deadline_exceeded = 0;
    std::uint64_t rollback_failures = 0;
    std::uint64_t commit_unknown = 0;
};

void check_counts(const gate_t& gate, const expected_counts& expected) {
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.admitted == expected.admitted);
    for (std::size_t i = 0; i < bulkhead::reject_reason_count; ++i) {
        INFO("reason " << bulkhead::to_string(static_cast<reject_reason>(i)));
        CHECK(stats.rejected[i] == expected.rejected[i]);
    }
    CHECK(stats.completed == expected.completed);
    CHECK(stats.failed == expected.failed);
    CHECK(stats.work_cancelled == expected.work_cancelled);
    CHECK(stats.work_deadline_exceeded == expected.work_deadline_exceeded);
    CHECK(stats.rollback_failures == expected.rollback_failures);
    CHECK(stats.commit_unknown == expected.commit_unknown);
}

std::size_t index(reject_reason reason) { return static_cast<std::size_t>(reason); }

}  // namespace

TEST_CASE("stats, a committed call counts admitted and completed, and times every stage", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 2, 1);
    gate.transaction(0ms, [](fake_pool::work&) {});
    check_counts(gate, {.admitted = 1, .completed = 1});
    const auto stats = gate.stats();
    CHECK(stats.permit_wait.count() == 1);
    CHECK(stats.pool_wait.count() == 1);
    CHECK(stats.connection_hold.count() == 1);
    CHECK(stats.work.count() == 1);
    CHECK(stats.call.count() == 1);
    CHECK(stats.concurrent == 2);
    CHECK(stats.extra_slots == 1);
    CHECK(stats.available == 2);
    CHECK(stats.available_slots == 3);
    CHECK(stats.running == 0);
    CHECK(stats.queued == 0);
}

TEST_CASE("stats, a permit from enter() counts admitted and reads no clock on the fast path", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    {
        auto held = gate.enter();
        CHECK(gate.stats().running == 1);
    }
    check_counts(gate, {.admitted = 1});
    CHECK(gate.stats().permit_wait.count() == 0);  // not timed: no clock read on the admission path
}

TEST_CASE("stats, admission_full is counted under its reason", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    bulkhead_test::blocker holder(gate);
    (void)gate.try_enter();
    CHECK_THROWS(gate.transaction(0ms, [](fake_pool::work&) {}));
    holder.go();
    expected_counts expected{.admitted = 1, .completed = 1};
    expected.rejected[index(reject_reason::admission_full)] = 2;
    check_counts(gate, expected);
}

TEST_CASE("stats, a queue timeout is counted, and its wait timed", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    bulkhead_test::blocker holder(gate);
    (void)gate.try_transaction(20ms, [](fake_pool::work&) {});
    holder.go();
    expected_counts expected{.admitted = 1, .completed = 1};
    expected.rejected[index(reject_reason::admission_timeout)] = 1;
    check_counts(gate, expected);
    const auto stats = gate.stats();
    CHECK(stats.permit_wait.count() == 2);
    CHECK(stats.permit_wait.quantile(1.0) >= 20e6 * (1 - bulkhead::log_linear_histogram::relative_error));
}

TEST_CASE("stats, a cancelled wait is counted", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    std::stop_source source;
    source.request_stop();
    (void)gate.try_enter({.stop = source.get_token()});
    expected_counts expected;
    expected.rejected[index(reject_reason::admission_cancelled)] = 1;
    check_counts(gate, expected);
}

TEST_CASE("stats, a passed deadline is counted", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    (void)gate.try_transaction({.deadline = std::chrono::steady_clock::now() - 1s}, [](fake_pool::work&) {});
    expected_counts expected;
    expected.rejected[index(reject_reason::deadline_exceeded)] = 1;
    check_counts(gate, expected);
}

TEST_CASE("stats, a pool timeout is counted as a rejection, after admission", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    pool.fail_acquire = true;
    (void)gate.try_transaction(0ms, [](fake_pool::work&) {});
    expected_counts expected{.admitted = 1};
    expected.rejected[index(reject_reason::pool_timeout)] = 1;
    check_counts(gate, expected);
}

TEST_CASE("stats, a callback that throws counts as failed", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    CHECK_THROWS(gate.transaction(0ms, [](fake_pool::work&) { throw std::runtime_error("no"); }));
    check_counts(gate, {.admitted = 1, .failed = 1});
}

TEST_CASE("stats, a failed commit counts as failed", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    pool.fail_commit = true;
    CHECK_THROWS(gate.transaction(0ms, [](fake_pool::work&) {}));
    check_counts(gate, {.admitted = 1, .failed = 1});
}

TEST_CASE("stats, a failed rollback is counted besides the failure", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    pool.fail_rollback = true;
    CHECK_THROWS(gate.transaction(0ms, [](fake_pool::work&) { throw std::runtime_error("no"); }));
    check_counts(gate, {.admitted = 1, .failed = 1, .rollback_failures = 1});
}

TEST_CASE("stats, work cancelled by a stop request is counted", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    std::stop_source source;
    CHECK_THROWS_AS(gate.transaction({.stop = source.get_token()}, [&](fake_pool::work&) { source.request_stop(); }),
                    bulkhead::work_cancelled);
    check_counts(gate, {.admitted = 1, .failed = 1, .work_cancelled = 1});
}

TEST_CASE("stats, work cut short by the deadline is counted", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    CHECK_THROWS_AS(gate.transaction({.deadline = std::chrono::steady_clock::now() + 10s},
                                     [](fake_pool::work&) { throw bulkhead_test::fake_deadline_hit(); }),
                    bulkhead::work_deadline_exceeded);
    check_counts(gate, {.admitted = 1, .failed = 1, .work_deadline_exceeded = 1});
}

TEST_CASE("stats, an unsettled commit is counted", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    pool.commit_throws_unknown = true;
    CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work&) {}), bulkhead::commit_unknown);
    check_counts(gate, {.admitted = 1, .failed = 1, .commit_unknown = 1});
}

// --- the per-thread stripes behind the frequent counts ----------------------

TEST_CASE("stats, counts from more threads than there are stripes add up exactly", "[stats]") {
    // 100 threads alive at once: 63 can own a stripe, the rest share one.
    constexpr int threads = 100;
    constexpr int calls = 2'000;
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    bulkhead::permit holder = gate.enter();  // every try_enter below is refused
    std::latch all_alive(threads);
    std::latch all_done(threads);
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&gate, &all_alive, &all_done] {
            all_alive.arrive_and_wait();
            for (int i = 0; i < calls; ++i) {
                (void)gate.try_enter();
            }
            all_done.arrive_and_wait();  // no thread exits (and frees its stripe) before all counted
        });
    }
    workers.clear();
    expected_counts expected{.admitted = 1};
    expected.rejected[static_cast<std::size_t>(reject_reason::admission_full)] = std::uint64_t{threads} * calls;
    check_counts(gate, expected);
}

TEST_CASE("stats, a stripe freed by an exiting thread goes to the next thread, its count kept", "[stats]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    bulkhead::permit holder = gate.enter();
    const auto refuse_from_new_thread = [&gate](int times) {
        std::size_t slot = 0;
        std::thread([&] {
            for (int i = 0; i < times; ++i) {
                (void)gate.try_enter();
            }
            slot = bulkhead::detail::stripe_slot::current();
        }).join();
        return slot;
    };
    const std::size_t first = refuse_from_new_thread(10);
    const std::size_t second = refuse_from_new_thread(5);
    CHECK(first != bulkhead::detail::stripe_slot::shared);
    CHECK(second == first);  // the lowest free slot, given back when the first thread exited
    expected_counts expected{.admitted = 1};
    expected.rejected[static_cast<std::size_t>(reject_reason::admission_full)] = 15;
    check_counts(gate, expected);
}

TEST_CASE("stats, threads alive at once never share an exclusive stripe", "[stats]") {
    constexpr std::size_t threads = bulkhead::detail::stripe_slot::count + 6;
    std::vector<std::size_t> slots(threads);
    std::latch all_claimed(static_cast<std::ptrdiff_t>(threads));
    {
        std::vector<std::jthread> workers;
        workers.reserve(threads);
        for (std::size_t t = 0; t < threads; ++t) {
            workers.emplace_back([&slots, &all_claimed, t] {
                slots[t] = bulkhead::detail::stripe_slot::current();
                all_claimed.arrive_and_wait();  // keep every slot taken until all have one
            });
        }
    }
    std::size_t shared = 0;
    std::vector<bool> seen(bulkhead::detail::stripe_slot::count);
    for (const std::size_t slot : slots) {
        REQUIRE(slot < bulkhead::detail::stripe_slot::count);
        if (slot == bulkhead::detail::stripe_slot::shared) {
            ++shared;
        } else {
            CHECK_FALSE(seen[slot]);
            seen[slot] = true;
        }
    }
    // At most 63 exclusive slots (the test's main thread may own one too).
    CHECK(shared >= threads - (bulkhead::detail::stripe_slot::count - 1));
}
