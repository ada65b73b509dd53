// Contract G1, G2 and G10 over the test-double pool: workload classes on one
// gate (workload.hpp, workload_scheduler.hpp). Permits are held with enter()
// from the test's thread (each with its own `task`, so one thread may hold
// several); waiters run on threads of their own, and the test orders events
// by what the gate shows (waiting(), a class's queued count), never by
// sleeping.
#include "fake_pool.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using bulkhead::reject_reason;
using bulkhead::workload_class;
using bulkhead::workload_id;
using bulkhead::workload_plan;
using bulkhead_test::fake_pool;
using gate_t = bulkhead::db_bulkhead<fake_pool>;

namespace {

/// interactive: 2 reserved, ceiling B; batch: none reserved, ceiling B,
/// and the higher priority (the adversary of the reservation).
workload_plan interactive_and_batch(int reserved = 2) {
    return workload_plan{{
        workload_class{.name = "interactive", .reserved = reserved, .ceiling = 0, .queue = 8},
        workload_class{.name = "batch", .reserved = 0, .ceiling = 0, .queue = 8, .priority = 10},
    }};
}

/// Holds permits from the test's thread, one task each.
class holder {
public:
    explicit holder(gate_t& gate) : m_gate(&gate) {}

    /// Enters `workload` with no wait; true when it got a permit.
    bool take(workload_id workload) {
        auto& task = m_tasks.emplace_back(std::make_unique<char>());
        bulkhead::result<bulkhead::permit> got = m_gate->try_enter({.task = task.get(), .workload = workload});
        if (!got) {
            return false;
        }
        m_permits.push_back(std::move(*got));
        return true;
    }

    /// Releases the oldest permit held of those still held.
    void release(std::size_t index) { m_permits.at(index).release(); }

    void release_all() {
        for (bulkhead::permit& held : m_permits) {
            held.release();
        }
    }

private:
    gate_t* m_gate;
    std::vector<std::unique_ptr<char>> m_tasks;
    std::vector<bulkhead::permit> m_permits;
};

int queued_in(const gate_t& gate, const std::string& name) {
    for (const bulkhead::workload_stats& one : gate.stats().workloads) {
        if (one.name == name) {
            return one.queued;
        }
    }
    return -1;
}

}  // namespace

TEST_CASE("[G10] a gate refuses a plan whose reservations do not fit inside B, showing the sum", "[G10]") {
    fake_pool pool;
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 3},
        workload_class{.name = "batch", .reserved = 2},
    }};
    REQUIRE_THROWS_MATCHES(gate_t(pool, {.concurrent = 4, .workloads = plan}), std::invalid_argument,
                           Catch::Matchers::Message("bulkhead workload plan: the reserved permits 3 (interactive) + 2 "
                                                    "(batch) = 5 do not fit inside B = 4"));
    // What fits exactly is accepted.
    const gate_t fits(pool, {.concurrent = 5, .workloads = plan});
    CHECK(fits.concurrent() == 5);
    CHECK(fits.available() == 5);
}

TEST_CASE("[A1] a gate refuses Q beside a workload plan, naming the setting, and builds nothing", "[A1]") {
    fake_pool pool;
    REQUIRE_THROWS_MATCHES(
        gate_t(pool, {.concurrent = 4, .extra_slots = 2, .workloads = interactive_and_batch()}), std::invalid_argument,
        Catch::Matchers::Message("bulkhead::db_bulkhead: extra_slots (Q) is for a gate without workload classes; "
                                 "with a plan, each class's queue sets its slots (leave extra_slots 0)"));
    CHECK(pool.acquired == 0);
    // The same settings without Q make the gate.
    const gate_t gate(pool, {.concurrent = 4, .workloads = interactive_and_batch()});
    CHECK(gate.has_workloads());
}

TEST_CASE("[G10] a plan is checked class by class, each refusal naming the class and the setting", "[G10]") {
    fake_pool pool;
    const auto refused = [&](const workload_plan& plan, const std::string& expected) {
        try {
            const gate_t gate(pool, {.concurrent = 4, .workloads = plan});
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            CAPTURE(message);
            CHECK(message.find(expected) != std::string::npos);
            return;
        }
        FAIL("accepted: " << expected);
    };
    refused(workload_plan{}, "it has no class");
    refused(workload_plan{{workload_class{.name = ""}}}, "class 0: the name \"\" must be 1-32 characters");
    refused(workload_plan{{workload_class{.name = "a b"}}}, "the name \"a b\"");
    refused(workload_plan{{workload_class{.name = "a"}, workload_class{.name = "a"}}},
            "the class name \"a\" appears twice");
    refused(workload_plan{{workload_class{.name = "a", .reserved = -1}}}, "class \"a\": reserved must not be negative");
    refused(workload_plan{{workload_class{.name = "a", .queue = -2}}}, "class \"a\": queue must not be negative");
    refused(workload_plan{{workload_class{.name = "a", .ceiling = 5}}}, "class \"a\": ceiling 5 is outside [0, B = 4]");
    refused(workload_plan{{workload_class{.name = "a", .reserved = 3, .ceiling = 2}}},
            "class \"a\": ceiling 2 is below its reserved 3");
    refused(workload_plan{{workload_class{.name = "a", .queue_wait = -1ms}}},
            "class \"a\": queue_wait must not be negative");
    workload_plan many;
    for (int i = 0; i <= bulkhead::max_workloads; ++i) {
        std::string name = "c";
        name += std::to_string(i);
        many.classes.push_back(workload_class{.name = name});
    }
    refused(many, "17 classes; at most 16");
    // An adaptive floor below the reservations could not honour them.
    try {
        const gate_t gate(pool, {.concurrent = 4,
                                 .workloads = interactive_and_batch(2),
                                 .adaptive = bulkhead::adaptive_options{.floor = 1}});
        FAIL("accepted a floor below the reservations");
    } catch (const std::invalid_argument& error) {
        CHECK(std::string(error.what()).find("the adaptive floor 1 is below the classes' reserved permits, 2") !=
              std::string::npos);
    }
}

TEST_CASE("[G10] a call names a class of its gate, or is refused as misuse", "[G10]") {
    fake_pool pool;
    gate_t gate(pool, {.concurrent = 4, .workloads = interactive_and_batch()});
    CHECK(gate.has_workloads());
    CHECK(gate.workload("interactive") == workload_id{0});
    CHECK(gate.workload("batch") == workload_id{1});
    CHECK(gate.workload_names() == std::vector<std::string>{"interactive", "batch"});
    REQUIRE_THROWS_MATCHES(
        gate.workload("reports"), std::invalid_argument,
        Catch::Matchers::Message(
            "bulkhead::db_bulkhead: no workload class named \"reports\"; this gate has: interactive batch"));
    REQUIRE_THROWS_AS(gate.transaction({.workload = workload_id{2}}, [](fake_pool::work&) {}), std::logic_error);
    REQUIRE_THROWS_AS(gate.try_enter({.workload = workload_id{-1}}), std::logic_error);
    CHECK(pool.acquired == 0);
    CHECK(gate.available_slots() == 2 * (4 + 8));  // nothing was taken

    // A plain gate has one class, "default".
    gate_t plain(pool, 2, 1);
    CHECK_FALSE(plain.has_workloads());
    CHECK(plain.workload("default") == workload_id{0});
    REQUIRE_THROWS_AS(plain.workload("batch"), std::invalid_argument);
    REQUIRE_THROWS_AS(plain.transaction({.workload = workload_id{1}}, [](fake_pool::work&) {}), std::logic_error);
    // (The id is read before the options are built: a throwing call inside a
    // designated initializer makes g++ 12 -O1 warn, falsely, of an
    // uninitialized stop_token.)
    const workload_id only = plain.workload("default");
    CHECK(plain.transaction({.workload = only}, [](fake_pool::work&) { return 7; }) == 7);
}

TEST_CASE("[G2] a class with waiters gets its reserved permits while another holds every shared one", "[G2]") {
    fake_pool pool;
    gate_t gate(pool, {.concurrent = 4, .workloads = interactive_and_batch(2)});
    const workload_id interactive = gate.workload("interactive");
    const workload_id batch = gate.workload("batch");
    holder held(gate);
    // batch takes both shared permits; a third batch call queues.
    REQUIRE(held.take(batch));
    REQUIRE(held.take(batch));
    CHECK_FALSE(held.take(batch));  // no wait: the shared permits are gone, the reserved ones are not batch's
    std::atomic<int> batch_got{0};
    std::thread batch_waiter([&] {
        const auto got = gate.try_enter({.queue_wait = 30s, .workload = batch});
        batch_got = got ? 1 : -1;
    });
    bulkhead_test::await([&] { return queued_in(gate, "batch") == 1; });
    // interactive gets its two reserved permits at once, though an older
    // batch caller of higher priority waits.
    REQUIRE(held.take(interactive));
    REQUIRE(held.take(interactive));
    CHECK(gate.running() == 4);
    CHECK(batch_got == 0);

    // A third interactive call waits; when an interactive permit comes back
    // it goes to that interactive waiter (its reservation), not to the
    // older, higher-priority batch waiter.
    std::atomic<int> interactive_got{0};
    std::thread interactive_waiter([&] {
        const auto got = gate.try_enter({.queue_wait = 30s, .workload = interactive});
        interactive_got = got ? 1 : -1;
    });
    bulkhead_test::await([&] { return queued_in(gate, "interactive") == 1; });
    held.release(2);  // an interactive permit
    interactive_waiter.join();
    CHECK(interactive_got == 1);
    CHECK(batch_got == 0);
    CHECK(queued_in(gate, "batch") == 1);

    // A batch permit coming back is shared: the batch waiter gets it.
    held.release(0);
    batch_waiter.join();
    CHECK(batch_got == 1);
    held.release_all();
    CHECK(gate.running() == 0);
    CHECK(gate.available() == 4);
}

TEST_CASE("[G2] a higher priority is served first for a shared permit, an older waiter first among equals", "[G2]") {
    fake_pool pool;
    const workload_plan plan{{
        workload_class{.name = "low_a", .queue = 4, .priority = 0},
        workload_class{.name = "low_b", .queue = 4, .priority = 0},
        workload_class{.name = "high", .queue = 4, .priority = 5},
    }};
    gate_t gate(pool, {.concurrent = 1, .workloads = plan});
    holder held(gate);
    REQUIRE(held.take(gate.workload("low_a")));

    std::mutex order_mutex;
    std::vector<std::string> order;
    std::vector<std::thread> waiters;
    const auto queue_one = [&](const std::string& name, int expected_waiting) {
        const workload_id workload = gate.workload(name);
        waiters.emplace_back([&, workload, name] {
            const auto got = gate.try_enter({.queue_wait = 30s, .workload = workload});
            {
                const std::lock_guard lock(order_mutex);
                order.push_back(got ? name : "refused " + name);
            }
            // Released here, in grant order: the next grant follows it.
        });
        bulkhead_test::await([&] { return gate.waiting() == expected_waiting; });
    };
    queue_one("low_b", 1);
    queue_one("low_a", 2);
    queue_one("high", 3);
    queue_one("low_b", 4);
    held.release_all();
    for (std::thread& waiter : waiters) {
        waiter.join();
    }
    // high first (priority), then the low classes in arrival order across
    // both: low_b, low_a, low_b.
    CHECK(order == std::vector<std::string>{"high", "low_b", "low_a", "low_b"});
    CHECK(gate.available() == 1);
}

TEST_CASE("[G2] a class at its ceiling waits though shared permits are free, and its queue bounds only it", "[G2]") {
    fake_pool pool;
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 1, .queue = 4},
        workload_class{.name = "batch", .ceiling = 1, .queue = 1, .queue_wait = 20ms},
    }};
    gate_t gate(pool, {.concurrent = 3, .workloads = plan});
    const workload_id batch = gate.workload("batch");
    holder held(gate);
    REQUIRE(held.take(batch));
    CHECK(gate.available() == 2);
    // At its ceiling: a second batch call times out after the class's
    // queue wait (20 ms), though it asked for 30 s and permits are free.
    const auto started = std::chrono::steady_clock::now();
    const auto second = gate.try_enter({.queue_wait = 30s, .workload = batch});
    const auto waited = std::chrono::steady_clock::now() - started;
    REQUIRE_FALSE(second);
    CHECK(second.error() == reject_reason::admission_timeout);
    CHECK(waited >= 20ms);
    CHECK(waited < 10s);  // bound with slack: far below the 30 s asked for
    // Its admission slots are ceiling + queue = 2: with one waiting, a
    // third batch call is turned away at once.
    std::thread waiting_batch([&] { (void)gate.try_enter({.queue_wait = 30s, .workload = batch}); });
    bulkhead_test::await([&] { return queued_in(gate, "batch") == 1; });
    const auto third = gate.try_enter({.queue_wait = 30s, .workload = batch});
    REQUIRE_FALSE(third);
    CHECK(third.error() == reject_reason::admission_full);
    // interactive is untouched by batch's full queue.
    REQUIRE(held.take(gate.workload("interactive")));
    REQUIRE(held.take(gate.workload("interactive")));
    waiting_batch.join();  // timed out after 20 ms

    const bulkhead::gate_stats stats = gate.stats();
    REQUIRE(stats.workloads.size() == 2);
    const bulkhead::workload_stats& batch_stats = stats.workloads[1];
    CHECK(batch_stats.name == "batch");
    CHECK(batch_stats.ceiling == 1);
    CHECK(batch_stats.running == 1);
    CHECK(batch_stats.admitted == 1);
    CHECK(batch_stats.rejections(reject_reason::admission_timeout) == 2);
    CHECK(batch_stats.rejections(reject_reason::admission_full) == 1);
    CHECK(stats.workloads[0].admitted == 2);
    CHECK(stats.workloads[0].ceiling == 3);  // 0 means B
    CHECK(stats.rejections(reject_reason::admission_full) == 1);
    held.release_all();
}

TEST_CASE("[G2] a stop ends a class's wait, and its slot and place go back", "[G2]") {
    fake_pool pool;
    gate_t gate(pool, {.concurrent = 1, .workloads = workload_plan{{workload_class{.name = "only", .queue = 1}}}});
    holder held(gate);
    REQUIRE(held.take(workload_id{0}));
    std::stop_source stop;
    auto waiter =
        std::async(std::launch::async, [&] { return gate.try_enter({.queue_wait = 30s, .stop = stop.get_token()}); });
    bulkhead_test::await([&] { return gate.waiting() == 1; });
    CHECK(gate.available_slots() == 0);
    stop.request_stop();
    const auto got = waiter.get();
    REQUIRE_FALSE(got);
    CHECK(got.error() == reject_reason::admission_cancelled);
    CHECK(gate.waiting() == 0);
    CHECK(gate.available_slots() == 1);
    held.release_all();
    CHECK(gate.transaction(0ms, [](fake_pool::work&) { return 1; }) == 1);
}

TEST_CASE("[G1] the calls running across classes never exceed B, nor a class its ceiling, and every permit comes back",
          "[G1]") {
    fake_pool pool;
    constexpr int concurrent = 4;
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 1, .ceiling = 3, .queue = 6, .priority = 1},
        workload_class{.name = "batch", .reserved = 1, .ceiling = 2, .queue = 6},
        workload_class{.name = "reports", .reserved = 0, .ceiling = 2, .queue = 6, .queue_wait = 2ms},
    }};
    gate_t gate(pool, {.concurrent = concurrent, .workloads = plan});
    std::atomic<int> inside{0};
    std::array<std::atomic<int>, 3> inside_class{};
    std::atomic<int> most{0};
    std::array<std::atomic<int>, 3> most_class{};
    std::atomic<int> completed{0};
    std::atomic<int> refused{0};
    constexpr int threads = 9;
    std::vector<std::thread> callers;
    callers.reserve(threads);
    constexpr int calls = 400;
    for (int t = 0; t < threads; ++t) {
        callers.emplace_back([&, t] {
            std::minstd_rand random(static_cast<unsigned>(t) + 1U);
            const int c = t % 3;
            for (int i = 0; i < calls; ++i) {
                std::stop_source stop;
                if (random() % 16 == 0) {
                    stop.request_stop();
                }
                const auto wait = std::chrono::microseconds(random() % 3 == 0 ? 0 : 500 + random() % 2000);
                const auto outcome = gate.try_transaction(
                    {.queue_wait = wait, .stop = stop.get_token(), .workload = workload_id{c}}, [&](fake_pool::work&) {
                        const int now = ++inside;
                        const int now_class = ++inside_class[static_cast<std::size_t>(c)];
                        bulkhead_test::raise_max(most, now);
                        bulkhead_test::raise_max(most_class[static_cast<std::size_t>(c)], now_class);
                        std::this_thread::yield();
                        --inside_class[static_cast<std::size_t>(c)];
                        --inside;
                    });
                (outcome ? completed : refused).fetch_add(1);
            }
        });
    }
    for (std::thread& caller : callers) {
        caller.join();
    }
    CHECK(completed + refused == threads * calls);
    CHECK(completed > 0);
    CHECK(most <= concurrent);
    CHECK(most_class[0] <= 3);
    CHECK(most_class[1] <= 2);
    CHECK(most_class[2] <= 2);
    // Every permit and slot came back.
    CHECK(gate.running() == 0);
    CHECK(gate.waiting() == 0);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == (3 + 6) + (2 + 6) + (2 + 6));
    const bulkhead::gate_stats stats = gate.stats();
    std::uint64_t admitted = 0;
    for (const bulkhead::workload_stats& one : stats.workloads) {
        admitted += one.admitted;
        CHECK(one.running == 0);
    }
    CHECK(admitted == stats.admitted);
    CHECK(static_cast<int>(stats.completed) == completed.load());
}

TEST_CASE("[G1] a resizing limit with classes loses, duplicates and strands no permit", "[G1][G7]") {
    // The scheduler itself, resized as an adaptive limit resizes it, while
    // threads of three classes take and release permits.
    const workload_plan plan =
        bulkhead::checked_workload_plan(workload_plan{{
                                            workload_class{.name = "a", .reserved = 1},
                                            workload_class{.name = "b", .reserved = 1, .ceiling = 3},
                                            workload_class{.name = "c", .priority = 3},
                                        }},
                                        6);
    bulkhead::detail::workload_scheduler scheduler(plan, 6);
    std::atomic<int> inside{0};
    std::atomic<int> most{0};
    std::atomic<bool> resizing{true};
    std::atomic<int> shrunk{0};  // shared permits out of circulation now
    std::atomic<int> over{0};    // times inside exceeded the capacity at that moment
    std::vector<std::thread> threads;
    threads.reserve(6);
    for (int t = 0; t < 6; ++t) {
        threads.emplace_back([&, t] {
            std::minstd_rand random(static_cast<unsigned>(t) + 7U);
            for (int i = 0; i < 3000; ++i) {
                const int c = static_cast<int>(random() % 3);
                const std::stop_token none;
                if (scheduler.try_acquire_for(c, std::chrono::microseconds(random() % 300), none) ==
                    bulkhead::wait_status::acquired) {
                    const int now = ++inside;
                    bulkhead_test::raise_max(most, now);
                    // Never above B; above the current limit only while a
                    // shrink's debt is being paid (a shrink takes nothing
                    // from holders).
                    if (now > 6) {
                        ++over;
                    }
                    --inside;
                    scheduler.release(c);
                }
            }
        });
    }
    std::thread resizer([&] {
        std::minstd_rand random(99);
        while (resizing) {
            if (shrunk < 4 && random() % 2 == 0) {
                scheduler.shrink(1);
                ++shrunk;
            } else if (shrunk > 0) {
                scheduler.grow(1);
                --shrunk;
            }
            std::this_thread::yield();
        }
        scheduler.grow(shrunk.exchange(0));
    });
    for (std::thread& thread : threads) {
        thread.join();
    }
    resizing = false;
    resizer.join();
    CHECK(most <= 6);
    CHECK(over == 0);
    CHECK(scheduler.total().running == 0);
    CHECK(scheduler.total().queued == 0);
    // Exactly the 6 permits are there: 6 takes succeed, a 7th does not.
    int taken = 0;
    for (int c : {0, 1, 2, 2, 2, 2, 0}) {
        taken += scheduler.try_acquire(c) ? 1 : 0;
    }
    CHECK(taken == 6);
}

TEST_CASE("[G8] a class's expected queue wait and retry delay come from its own holds", "[G8][G9]") {
    fake_pool pool;
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 1, .ceiling = 1, .queue = 4},
        workload_class{.name = "batch", .ceiling = 1, .queue = 4},
    }};
    gate_t gate(pool, {.concurrent = 2, .workloads = plan});
    const workload_id interactive = gate.workload("interactive");
    const workload_id batch = gate.workload("batch");
    // Nothing known yet: no estimate, no delay.
    CHECK(gate.expected_queue_wait(batch) == 0ns);
    CHECK(gate.suggested_retry_delay(batch) == 0ms);
    gate.transaction({.workload = batch}, [](fake_pool::work&) { std::this_thread::sleep_for(40ms); });
    gate.transaction({.workload = interactive}, [](fake_pool::work&) {});
    const auto batch_hold = gate.stats().workloads[1].mean_permit_hold;
    CHECK(batch_hold >= 40ms);
    CHECK(gate.stats().workloads[0].mean_permit_hold < batch_hold);
    // A free permit: no wait for either.
    CHECK(gate.expected_queue_wait(batch) == 0ns);
    holder held(gate);
    REQUIRE(held.take(batch));
    // batch is at its ceiling: a batch call would wait one batch hold;
    // interactive would not wait at all.
    CHECK(gate.expected_queue_wait(batch) == batch_hold);
    CHECK(gate.expected_queue_wait(interactive) == 0ns);
    CHECK(gate.suggested_retry_delay(batch) == std::chrono::ceil<std::chrono::milliseconds>(2 * batch_hold));
    // A batch call whose deadline is shorter than that is refused at once.
    const auto refused = gate.try_transaction(
        {.queue_wait = 10s, .deadline = std::chrono::steady_clock::now() + batch_hold / 4, .workload = batch},
        [](fake_pool::work&) {});
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == reject_reason::deadline_exceeded);
    CHECK(gate.stats().deadline_rejected_early == 1);
    CHECK(gate.stats().workloads[1].rejections(reject_reason::deadline_exceeded) == 1);
    // The rejection thrown carries the class's delay.
    try {
        gate.transaction({.queue_wait = 0ms, .workload = batch}, [](fake_pool::work&) {});
        FAIL("admitted past the ceiling");
    } catch (const bulkhead::rejected& rejection) {
        CHECK(rejection.reason() == reject_reason::admission_timeout);
        CHECK(rejection.retry_after() == gate.suggested_retry_delay(batch));
    }
    REQUIRE_THROWS_AS(gate.expected_queue_wait(workload_id{5}), std::logic_error);
    held.release_all();
}
