// Contract G8 and G9 over the test-double pool: a call whose deadline leaves
// less time than the gate's expected queue wait is refused at admission with
// deadline_exceeded (G8), and a rejection carries a retry delay computed from
// the gate's own figures (G9). The figures come from real permit holds: a
// transaction whose callback sleeps holds its permit that long (the sleep is
// the work being measured, it orders nothing).
#include "fake_pool.hpp"
#include "gate_blocker.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/prometheus.hpp>

#include "catch.hpp"

#include <chrono>
#include <future>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using bulkhead::reject_reason;
using bulkhead_test::blocker;
using bulkhead_test::fake_pool;
using gate_t = bulkhead::db_bulkhead<fake_pool>;
using clock_type = std::chrono::steady_clock;

namespace {

/// One transaction that holds its permit for `hold`: the gate's mean permit
/// hold starts from it (the first sample is taken as it is).
void teach_hold(gate_t& gate, std::chrono::milliseconds hold) {
    gate.transaction(0ms, [hold](fake_pool::work&) { std::this_thread::sleep_for(hold); });
}

std::uint64_t early(const gate_t& gate) { return gate.stats().deadline_rejected_early; }

std::uint64_t deadline_rejections(const gate_t& gate) {
    return gate.stats().rejections(reject_reason::deadline_exceeded);
}

}  // namespace

TEST_CASE(
    "[G8] a call whose deadline is shorter than the expected queue wait is refused at admission with "
    "deadline_exceeded, without waiting",
    "[G8]") {
    fake_pool pool;
    gate_t gate(pool, 1, 4);
    namespace timing = bulkhead_test::early_refusal;
    teach_hold(gate, timing::hold);
    const auto mean = gate.stats().mean_permit_hold;
    CHECK(mean >= timing::hold);
    CHECK(gate.expected_queue_wait() == 0ns);  // a permit is free: nobody would wait
    blocker busy(gate);
    // One call ahead (the blocker), none queued: (0 + 1) x mean / B.
    CHECK(gate.expected_queue_wait() == mean);
    CHECK(gate.stats().expected_queue_wait == mean);

    SECTION("transaction(): deadline_exceeded at once, the slot given back, counted as early") {
        const std::size_t events = pool.events().size();
        const auto start = clock_type::now();
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 10s, .deadline = start + timing::deadline}, [](fake_pool::work&) {}),
            bulkhead::deadline_exceeded);
        // Without the estimate the call would have waited its deadline out.
        CHECK(clock_type::now() - start < timing::bound);
        CHECK(early(gate) == 1);
        CHECK(deadline_rejections(gate) == 1);
        CHECK(gate.available_slots() == 4);     // the blocker's slot is the one taken
        CHECK(pool.events().size() == events);  // nothing reached the pool
    }
    SECTION("a deadline that leaves the queue wait but not the work after it is refused too") {
        // The wait (one hold) fits, the wait and a committed call's hold do not.
        const auto committed = gate.stats().mean_committed_hold;
        CHECK(committed >= timing::hold);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 10s, .deadline = start + mean + committed / 2}, [](fake_pool::work&) {}),
            bulkhead::deadline_exceeded);
        CHECK(clock_type::now() - start < mean);  // refused at once, not after waiting
        CHECK(early(gate) == 1);
    }
    SECTION("try_transaction() and try_enter() refuse it the same way") {
        const auto deadline = clock_type::now() + timing::deadline;
        auto result = gate.try_transaction({.queue_wait = 10s, .deadline = deadline}, [](fake_pool::work&) {});
        REQUIRE_FALSE(result);
        CHECK(result.error() == reject_reason::deadline_exceeded);
        auto entered = gate.try_enter({.queue_wait = 10s, .deadline = deadline});
        REQUIRE_FALSE(entered);
        CHECK(entered.error() == reject_reason::deadline_exceeded);
        CHECK(early(gate) == 2);
    }
    SECTION("reject_unreachable_deadline = false waits until the deadline") {
        const auto start = clock_type::now();
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 10s, .deadline = start + 30ms, .reject_unreachable_deadline = false},
                             [](fake_pool::work&) {}),
            bulkhead::deadline_exceeded);
        CHECK(clock_type::now() - start >= 30ms);
        CHECK(early(gate) == 0);
        CHECK(deadline_rejections(gate) == 1);
    }
    SECTION("a queue wait shorter than the expected wait is not the deadline: it waits, admission_timeout") {
        const auto start = clock_type::now();
        CHECK_THROWS_AS(gate.transaction({.queue_wait = 20ms, .deadline = start + 10s}, [](fake_pool::work&) {}),
                        bulkhead::admission_timeout);
        CHECK(clock_type::now() - start >= 20ms);
        CHECK(early(gate) == 0);
    }
    SECTION("a deadline that leaves room queues, and gets the permit when it is released") {
        auto queued = std::async(std::launch::async, [&] {
            return gate.transaction({.queue_wait = 10s, .deadline = clock_type::now() + 10s},
                                    [](fake_pool::work&) { return 7; });
        });
        bulkhead_test::await([&] { return gate.waiting() == 1; });
        // Now two calls are ahead of a newcomer: (1 + 1) x mean / B.
        CHECK(gate.expected_queue_wait() == 2 * gate.stats().mean_permit_hold);
        busy.go();
        CHECK(queued.get() == 7);
        CHECK(early(gate) == 0);
    }
}

TEST_CASE("[G8] before any transaction finished nothing is refused early, and a free permit is never refused", "[G8]") {
    fake_pool pool;
    gate_t gate(pool, 1, 2);
    SECTION("no figures yet: the call waits its deadline out") {
        blocker busy(gate);
        CHECK(gate.expected_queue_wait() == 0ns);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(gate.transaction({.queue_wait = 10s, .deadline = start + 20ms}, [](fake_pool::work&) {}),
                        bulkhead::deadline_exceeded);
        CHECK(clock_type::now() - start >= 20ms);
        CHECK(early(gate) == 0);
    }
    SECTION("a free permit: admitted whatever the mean") {
        teach_hold(gate, 50ms);
        CHECK(gate.transaction({.deadline = clock_type::now() + 5s}, [](fake_pool::work&) { return 1; }) == 1);
        CHECK(early(gate) == 0);
    }
}

TEST_CASE("[G9] a rejection carries a retry delay derived from the gate's own figures", "[G9]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    SECTION("before any transaction finished, the gate suggests nothing") {
        blocker busy(gate);
        CHECK(gate.suggested_retry_delay() == 0ms);
        try {
            (void)gate.enter();
            FAIL("a full gate admitted the call");
        } catch (const bulkhead::rejected& rejection) {
            CHECK(rejection.reason() == reject_reason::admission_timeout);  // the free slot, and no permit at once
            CHECK(rejection.retry_after() == 0ms);
        }
    }
    SECTION("the backlog and the retry spread over B: (running + queued + 1) x mean hold / B") {
        teach_hold(gate, 40ms);
        const auto mean = gate.stats().mean_permit_hold;
        CHECK(gate.suggested_retry_delay() == std::chrono::ceil<std::chrono::milliseconds>(mean));  // 0 + 0 + 1
        blocker busy(gate);
        auto queued = std::async(std::launch::async, [&] { return gate.transaction(10s, [](fake_pool::work&) {}); });
        bulkhead_test::await([&] { return gate.waiting() == 1; });
        const auto expected = std::chrono::ceil<std::chrono::milliseconds>(3 * mean);  // 1 running + 1 queued + 1
        CHECK(gate.suggested_retry_delay() == expected);
        CHECK(gate.stats().suggested_retry_delay == expected);
        CHECK(expected >= 120ms);
        try {
            gate.transaction(0ms, [](fake_pool::work&) {});
            FAIL("a full gate admitted the call");
        } catch (const bulkhead::rejected& rejection) {
            CHECK(rejection.reason() == reject_reason::admission_full);
            CHECK(rejection.retry_after() == expected);
        }
        // The same figures reach the metrics.
        bulkhead::prometheus_exposition metrics;
        metrics.add("g", gate.stats());
        const std::string text = metrics.render();
        CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_suggested_retry_delay_seconds{gate=\"g\"} "));
        CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_mean_permit_hold_seconds{gate=\"g\"} "));
        CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_deadline_rejected_early_total{gate=\"g\"} 0\n"));
        busy.go();
        queued.get();
    }
    SECTION("a rejection made by the pool (no connection in time) carries the gate's delay, and its own message") {
        teach_hold(gate, 40ms);
        pool.fail_acquire = true;
        try {
            gate.transaction(0ms, [](fake_pool::work&) {});
            FAIL("the pool's failure was lost");
        } catch (const bulkhead::pool_timeout& rejection) {
            CHECK(std::string(rejection.what()) == "fake_pool: no connection");
            // Made while the call held its permit: (1 running + 1) x the mean.
            CHECK(rejection.retry_after() >= 80ms);
        }
    }
    SECTION("a short hold suggests at least 1 ms") {
        gate.transaction(0ms, [](fake_pool::work&) {});
        CHECK(gate.stats().mean_permit_hold > 0ns);
        CHECK(gate.suggested_retry_delay() >= 1ms);
    }
}

TEST_CASE("[G9] the mean permit hold follows the holds of finished transactions, each weighing 1/16", "[G9]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    teach_hold(gate, 80ms);
    const auto first = gate.stats().mean_permit_hold;
    CHECK(first >= 80ms);
    // One short call moves the mean down by a sixteenth of the difference.
    // Its hold lies within the call's own wall time, however slow the build.
    const auto started = std::chrono::steady_clock::now();
    gate.transaction(0ms, [](fake_pool::work&) {});
    const std::chrono::nanoseconds elapsed = std::chrono::steady_clock::now() - started;
    REQUIRE(elapsed < first);
    const auto second = gate.stats().mean_permit_hold;
    CHECK(second < first);
    CHECK(second >= first - first / 16);
    CHECK(second <= first - (first - elapsed) / 16);
}
