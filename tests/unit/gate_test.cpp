// db_bulkhead over a test-double pool: contract section A (permits) and the
// rollback bookkeeping of section B that a fake pool can show (B3, B5, B6, B8).
#include "fake_pool.hpp"
#include "gate_blocker.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <random>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using bulkhead_test::fake_pool;
using bulkhead_test::recording_observer;
using gate_t = bulkhead::db_bulkhead<fake_pool>;

namespace {

using bulkhead_test::await;
using bulkhead_test::blocker;
using bulkhead_test::raise_max;

/// Starts a caller that queues for a permit with a long wait; returns once it is queued.
template <class Gate>
std::thread queued_caller(Gate& gate, std::int64_t queued_before, std::function<void()> on_run = {},
                          std::stop_token stop = {}, std::atomic<int>* outcome_rejected = nullptr) {
    std::thread caller([&gate, on_run = std::move(on_run), stop, outcome_rejected] {
        try {
            gate.transaction({.queue_wait = 30s, .stop = stop}, [&](fake_pool::work&) {
                if (on_run) {
                    on_run();
                }
                return 0;
            });
        } catch (const bulkhead::rejected&) {
            if (outcome_rejected != nullptr) {
                ++*outcome_rejected;
            }
        }
    });
    await([&] { return gate.waiting() == queued_before + 1; });
    return caller;
}

struct not_a_std_exception {
    int code;
};

}  // namespace

// --- static guarantees ------------------------------------------------------
static_assert(std::is_base_of_v<std::runtime_error, bulkhead::rejected>);
static_assert(std::is_base_of_v<bulkhead::rejected, bulkhead::admission_full>);
static_assert(std::is_base_of_v<bulkhead::rejected, bulkhead::admission_timeout>);
static_assert(std::is_base_of_v<bulkhead::rejected, bulkhead::admission_cancelled>);
static_assert(std::is_base_of_v<bulkhead::rejected, bulkhead::pool_timeout>);
static_assert(std::is_base_of_v<bulkhead::rejected, bulkhead::deadline_exceeded>);
static_assert(!std::is_copy_constructible_v<bulkhead::permit> &&
              std::is_nothrow_move_constructible_v<bulkhead::permit>);
static_assert(std::is_nothrow_move_assignable_v<bulkhead::permit> && std::is_nothrow_destructible_v<bulkhead::permit>);
static_assert(!std::is_copy_constructible_v<gate_t> && !std::is_move_constructible_v<gate_t>);
static_assert(!std::is_copy_constructible_v<bulkhead::transaction_guard<fake_pool>>);
static_assert(std::is_nothrow_destructible_v<bulkhead::transaction_guard<fake_pool>>);
static_assert(noexcept(std::declval<bulkhead::transaction_guard<fake_pool>&>().rollback()));
static_assert(noexcept(std::declval<gate_t&>().available()) && noexcept(std::declval<gate_t&>().available_slots()));

// --- A1 ---------------------------------------------------------------------
TEST_CASE("[A1] construction rejects B < 1, negative Q and an overflowing B + Q", "[gate][A1]") {
    fake_pool pool;
    CHECK_THROWS_AS(gate_t(pool, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS(gate_t(pool, -3, 1), std::invalid_argument);
    CHECK_THROWS_AS(gate_t(pool, 1, -1), std::invalid_argument);
    CHECK_THROWS_AS(gate_t(pool, std::numeric_limits<int>::max(), 1), std::overflow_error);
    CHECK_THROWS_AS(gate_t(pool, 2, std::numeric_limits<int>::max() - 1), std::overflow_error);
    CHECK_THROWS_WITH(gate_t(pool, 0, 0), Catch::Matchers::ContainsSubstring("concurrent (B)"));
    CHECK_THROWS_WITH(gate_t(pool, 1, -1), Catch::Matchers::ContainsSubstring("extra_slots (Q)"));
    gate_t largest(pool, std::numeric_limits<int>::max() - 5, 5);
    CHECK(largest.available_slots() == std::numeric_limits<int>::max());
    bulkhead::db_bulkhead gate(pool, 3, 2);  // class template argument deduction
    static_assert(std::is_same_v<decltype(gate), gate_t>);
    CHECK(gate.available() == 3);
    CHECK(gate.available_slots() == 5);
    CHECK(gate.concurrent() == 3);
    CHECK(gate.extra_slots() == 2);
}

// --- A2 ---------------------------------------------------------------------
TEST_CASE("[A2] a negative queue wait or an empty callable is rejected before any permit is taken", "[gate][A2]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    CHECK_THROWS_AS(gate.transaction(-1ms, [](fake_pool::work&) { return 1; }), std::invalid_argument);
    CHECK_THROWS_WITH(gate.transaction(-1ms, [](fake_pool::work&) { return 1; }),
                      Catch::Matchers::ContainsSubstring("queue_wait"));
    CHECK_THROWS_AS(gate.try_transaction(-1ns, [](fake_pool::work&) {}), std::invalid_argument);
    CHECK_THROWS_AS(gate.enter({.queue_wait = -1s}), std::invalid_argument);

    int (*null_function)(fake_pool::work&) = nullptr;
    CHECK_THROWS_AS(gate.transaction(1s, null_function), std::invalid_argument);
    std::function<int(fake_pool::work&)> empty;
    CHECK_THROWS_AS(gate.transaction(1s, empty), std::invalid_argument);
    CHECK_THROWS_AS(gate.try_transaction(1s, empty), std::invalid_argument);

    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 2);
    CHECK(pool.acquired == 0);
}

// --- A3 ---------------------------------------------------------------------
TEST_CASE("[A3] with every slot taken a call is rejected at once with admission_full", "[gate][A3]") {
    fake_pool pool;
    recording_observer observer_unused;
    (void)observer_unused;
    gate_t gate(pool, 1, 0);
    blocker hold(gate);
    const int acquired_before = pool.acquired;

    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(gate.transaction(10s, [](fake_pool::work&) { return 1; }), bulkhead::admission_full);
    CHECK(std::chrono::steady_clock::now() - start < 1s);  // a long queue wait changes nothing
    CHECK_THROWS_WITH(gate.transaction(10s, [](fake_pool::work&) { return 1; }), "db admission full");

    SECTION("the non-throwing twin reports it as a result") {
        auto outcome = gate.try_transaction(10s, [](fake_pool::work&) { return 1; });
        REQUIRE_FALSE(outcome);
        CHECK(outcome.error() == bulkhead::reject_reason::admission_full);
        CHECK_THROWS_AS(outcome.value(), bulkhead::admission_full);
        auto entry = gate.try_enter({.queue_wait = 10s});
        REQUIRE_FALSE(entry);
        CHECK(entry.error() == bulkhead::reject_reason::admission_full);
    }
    CHECK(pool.acquired == acquired_before);
    CHECK(gate.available_slots() == 0);
}

// --- A4 ---------------------------------------------------------------------
TEST_CASE("[A4] a waiter gives up after its queue wait and returns only its admission slot", "[gate][A4]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    blocker hold(gate);
    const int acquired_before = pool.acquired;

    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_MATCHES(gate.transaction(50ms, [](fake_pool::work&) { return 1; }), bulkhead::admission_timeout,
                         Catch::Matchers::Message("db admission timed out"));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 50ms);
    CHECK(elapsed < 5s);
    CHECK(gate.available_slots() == 1);  // the blocker's slot only
    CHECK(gate.available() == 0);        // the blocker still runs
    CHECK(gate.waiting() == 0);

    auto outcome = gate.try_transaction(10ms, [](fake_pool::work&) { return 1; });
    CHECK(outcome.error() == bulkhead::reject_reason::admission_timeout);
    CHECK(pool.acquired == acquired_before);
    hold.go();
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 2);
}

// --- A5 ---------------------------------------------------------------------
TEST_CASE("[A5] a zero queue wait succeeds when a permit is free and never overtakes a waiter", "[gate][A5]") {
    fake_pool pool;
    gate_t gate(pool, 1, 2);
    CHECK(gate.transaction(0ms, [](fake_pool::work&) { return 7; }) == 7);

    std::mutex order_mutex;
    std::vector<std::string> order;
    auto hold = std::make_unique<blocker<gate_t>>(gate);
    std::thread waiter = queued_caller(gate, 0, [&] {
        const std::lock_guard lock(order_mutex);
        order.emplace_back("queued waiter");
    });
    // The waiter is queued: a zero-wait call is turned away, it does not jump the queue.
    CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work&) { return 0; }), bulkhead::admission_timeout);
    hold.reset();
    waiter.join();
    CHECK(order == std::vector<std::string>{"queued waiter"});
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 3);
}

// --- A6 ---------------------------------------------------------------------
TEST_CASE("[A6] a stop request while waiting throws admission_cancelled and returns only the slot",
          "[gate][A6][cancel]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);

    SECTION("stop while queued") {
        blocker hold(gate);
        std::stop_source source;
        std::atomic<int> rejected{0};
        const int acquired_before = pool.acquired;
        std::thread waiter = queued_caller(gate, 0, {}, source.get_token(), &rejected);
        source.request_stop();
        waiter.join();
        CHECK(rejected == 1);
        CHECK(gate.available_slots() == 1);
        CHECK(gate.waiting() == 0);
        CHECK(pool.acquired == acquired_before);
    }
    SECTION("a stop already requested rejects without touching the pool, even with free permits") {
        std::stop_source source;
        source.request_stop();
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 1s, .stop = source.get_token()}, [](fake_pool::work&) { return 1; }),
            bulkhead::admission_cancelled);
        auto outcome = gate.try_enter({.stop = source.get_token()});
        CHECK(outcome.error() == bulkhead::reject_reason::admission_cancelled);
        CHECK(pool.acquired == 0);
        CHECK(gate.available() == 1);
        CHECK(gate.available_slots() == 2);
    }
}

// --- A7 ---------------------------------------------------------------------
TEST_CASE("[A7] every rejection derives from bulkhead::rejected and says the work never started", "[gate][A7]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    auto rejection_of = [&](auto call) -> std::string {
        try {
            call();
        } catch (const bulkhead::rejected& rejection) {
            return std::string(bulkhead::to_string(rejection.reason()));
        }
        return "none";
    };
    {
        blocker hold(gate);
        CHECK(rejection_of([&] { gate.transaction(0ms, [](fake_pool::work&) {}); }) == "admission_full");
    }
    const int begun_before = pool.begun;
    pool.fail_acquire = true;
    CHECK(rejection_of([&] { gate.transaction(0ms, [](fake_pool::work&) {}); }) == "pool_timeout");
    pool.fail_acquire = false;
    CHECK(rejection_of([&] {
              gate.transaction({.deadline = std::chrono::steady_clock::now() - 1ms}, [](fake_pool::work&) {});
          }) == "deadline_exceeded");
    CHECK(pool.begun == begun_before);
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 1);
}

// --- A8 ---------------------------------------------------------------------
TEST_CASE("[A8] permits are released only after the connection, transaction and cleanup finished", "[gate][A8]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);

    SECTION("normal completion: commit and return happen before the permit is back") {
        int seen_available = -1;
        gate.transaction(0ms, [&](fake_pool::work&) {
            seen_available = gate.available();
            return 0;
        });
        CHECK(seen_available == 0);
        CHECK(pool.events() == std::vector<std::string>{"acquire", "begin", "commit", "return"});
        CHECK(gate.available() == 1);
    }
    SECTION("a caller that stops waiting for the result does not free the permits") {
        std::latch release_work(1);
        auto result = std::async(std::launch::async, [&] {
            return gate.transaction(0ms, [&](fake_pool::work&) {
                release_work.wait();
                return 42;
            });
        });
        CHECK(result.wait_for(20ms) == std::future_status::timeout);  // the caller gives up waiting
        CHECK(gate.available() == 0);
        CHECK(gate.available_slots() == 0);
        CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work&) {}), bulkhead::admission_full);
        release_work.count_down();
        CHECK(result.get() == 42);
        CHECK(gate.available() == 1);
    }
    SECTION("a callback that throws: rollback and return happen before the permit is back") {
        CHECK_THROWS_AS(gate.transaction(0ms, [&](fake_pool::work&) -> int { throw std::runtime_error("boom"); }),
                        std::runtime_error);
        CHECK(pool.events() == std::vector<std::string>{"acquire", "begin", "rollback", "return"});
        CHECK(gate.available() == 1);
    }
}

// --- A9 ---------------------------------------------------------------------
TEST_CASE("[A9] no mix of timeouts, stop requests, failures and releases creates or loses a permit",
          "[gate][A9][race]") {
    const int concurrent = GENERATE(1, 3);
    const int extra = GENERATE(0, 4);
    fake_pool pool;
    gate_t gate(pool, concurrent, extra);
    std::atomic<int> outcomes{0};
    std::vector<std::thread> threads;
    threads.reserve(12);
    for (int t = 0; t < 12; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937 random(static_cast<unsigned>(t));
            for (int i = 0; i < 400; ++i) {
                std::stop_source source;
                const int kind = static_cast<int>(random() % 6);
                if (kind == 5) {
                    source.request_stop();
                }
                std::jthread canceller;
                if (kind == 4) {
                    canceller = std::jthread([&source] { source.request_stop(); });
                }
                try {
                    auto value = gate.try_transaction(
                        {.queue_wait = std::chrono::microseconds(random() % 300), .stop = source.get_token()},
                        [&](fake_pool::work& work) {
                            if (kind == 1) {
                                throw std::runtime_error("callback failed");
                            }
                            if (kind == 2) {
                                work.commit();  // refused: logic_error
                            }
                            return kind;
                        });
                    (void)value;
                } catch (const std::exception&) {
                }
                ++outcomes;
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(outcomes == 12 * 400);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == concurrent + extra);
    CHECK(gate.waiting() == 0);
    CHECK(pool.in_use == 0);
    CHECK(pool.begun == pool.commits + pool.rollbacks);
}

// --- A10 --------------------------------------------------------------------
TEST_CASE("[A10] with all B running at most Q more are inside, and the next extra caller is refused", "[gate][A10]") {
    fake_pool pool;
    gate_t gate(pool, 2, 3);
    blocker first(gate);
    blocker second(gate);
    std::vector<std::thread> waiters;
    waiters.reserve(3);
    for (int i = 0; i < 3; ++i) {
        waiters.push_back(queued_caller(gate, i));
    }
    CHECK(gate.waiting() == 3);
    CHECK(gate.available_slots() == 0);
    CHECK_THROWS_AS(gate.transaction(10s, [](fake_pool::work&) {}), bulkhead::admission_full);
    first.go();
    second.go();
    for (auto& waiter : waiters) {
        waiter.join();
    }
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 5);
}

// --- A11 --------------------------------------------------------------------
TEST_CASE("[A11] never more than B callbacks run and never more than Q wait, under many threads",
          "[gate][A11][stress]") {
    const int concurrent = GENERATE(1, 4);
    const int extra = 3;
    fake_pool pool;
    gate_t gate(pool, concurrent, extra);
    std::atomic<int> running{0};
    std::atomic<int> most_running{0};
    std::atomic<bool> done{false};
    std::atomic<int> most_waiting{0};
    std::thread sampler([&] {
        while (!done) {
            raise_max(most_waiting, gate.waiting());
            std::this_thread::yield();
        }
    });
    std::vector<std::thread> threads;
    threads.reserve(32);
    for (int t = 0; t < 32; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 300; ++i) {
                (void)gate.try_transaction(200us, [&](fake_pool::work&) {
                    raise_max(most_running, ++running);
                    std::this_thread::yield();
                    --running;
                });
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    done = true;
    sampler.join();
    CHECK(most_running.load() <= concurrent);
    CHECK(most_waiting.load() <= extra);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == concurrent + extra);
}

// --- A12 --------------------------------------------------------------------
TEST_CASE("[A12] waiters are granted execution permits in arrival order", "[gate][A12][fifo]") {
    constexpr int waiters = 16;
    fake_pool pool;
    gate_t gate(pool, 1, waiters);
    std::mutex order_mutex;
    std::vector<int> order;
    auto hold = std::make_unique<blocker<gate_t>>(gate);
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(waiters));
    for (int i = 0; i < waiters; ++i) {
        threads.push_back(queued_caller(gate, i, [&, i] {
            const std::lock_guard lock(order_mutex);
            order.push_back(i);
        }));
    }
    hold.reset();
    for (auto& thread : threads) {
        thread.join();
    }
    std::vector<int> expected;
    expected.reserve(static_cast<std::size_t>(waiters));
    for (int i = 0; i < waiters; ++i) {
        expected.push_back(i);
    }
    CHECK(order == expected);
}

// --- A13 --------------------------------------------------------------------
TEST_CASE("[A13] entering the same gate again from a thread that holds it throws logic_error", "[gate][A13]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    gate_t other(pool, 1, 0);

    SECTION("from inside the callback") {
        CHECK_THROWS_AS(
            gate.transaction(
                1s, [&](fake_pool::work&) { return gate.transaction(1s, [](fake_pool::work&) { return 0; }); }),
            std::logic_error);
        CHECK_THROWS_WITH(gate.transaction(1s, [&](fake_pool::work&) { (void)gate.enter(); }),
                          Catch::Matchers::ContainsSubstring("not reentrant"));
    }
    SECTION("while holding a permit from enter()") {
        bulkhead::permit held = gate.enter();
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_AS(gate.transaction(10s, [](fake_pool::work&) {}), std::logic_error);
        CHECK_THROWS_AS(gate.try_enter({.queue_wait = 10s}), std::logic_error);
        CHECK(std::chrono::steady_clock::now() - start < 1s);
        held.release();
        CHECK_NOTHROW(gate.transaction(0ms, [](fake_pool::work&) {}));
    }
    SECTION("a different gate is fine") {
        CHECK(gate.transaction(1s, [&](fake_pool::work&) {
            return other.transaction(1s, [](fake_pool::work&) { return 5; });
        }) == 5);
    }
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 2);
}

// --- A14 --------------------------------------------------------------------
TEST_CASE("[A14] available() and available_slots() only observe, and admission decides by itself", "[gate][A14]") {
    fake_pool pool;
    gate_t gate(pool, 2, 1);
    // Admit exactly B + Q holders without ever reading the observers first.
    std::vector<std::thread> holders;
    std::latch admitted(3);
    std::latch release(1);
    std::atomic<int> got{0};
    for (int i = 0; i < 3; ++i) {
        holders.emplace_back([&] {
            auto entry = gate.try_enter({.queue_wait = 10s});
            if (entry) {
                ++got;
            }
            admitted.count_down();
            release.wait();
        });
        if (i < 2) {
            await([&] { return got == i + 1; });
        } else {
            await([&] { return gate.waiting() == 1; });
        }
    }
    // The third is queued; it is inside the gate without running.
    CHECK(gate.available() == 0);
    CHECK(gate.available_slots() == 0);
    CHECK(gate.waiting() == 1);
    CHECK(gate.try_enter().error() == bulkhead::reject_reason::admission_full);
    release.count_down();
    for (auto& holder : holders) {
        holder.join();
    }
    CHECK(got == 3);
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 3);
}

// --- A15 --------------------------------------------------------------------
TEST_CASE("[A15] a move-only permit from enter() releases what it holds exactly once", "[gate][A15][permit]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    {
        bulkhead::permit first = gate.enter();
        CHECK(first);
        CHECK(gate.available() == 1);
        bulkhead::permit moved = std::move(first);
        CHECK_FALSE(first);  // NOLINT(bugprone-use-after-move): checking the moved-from state
        CHECK(moved);
        CHECK(gate.available() == 1);
        moved.release();
        moved.release();  // idempotent
        CHECK_FALSE(moved);
        CHECK(gate.available() == 2);
        CHECK(gate.available_slots() == 2);

        gate_t other(pool, 1, 0);
        bulkhead::permit a = gate.enter();
        bulkhead::permit b = other.enter();
        CHECK(gate.available() == 1);
        CHECK(other.available() == 0);
        a = std::move(b);  // gives back a's permit, takes b's
        CHECK(gate.available() == 2);
        CHECK(other.available() == 0);
        a.release();
        CHECK(other.available() == 1);
        CHECK(other.available_slots() == 1);
        bulkhead::permit empty;
        CHECK_FALSE(empty);
    }
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 2);
    CHECK(pool.acquired == 0);  // a permit touches no pool
}

TEST_CASE("[A15] try_enter reports a queue timeout as a result", "[gate][A15][permit]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    blocker hold(gate);
    auto entry = gate.try_enter({.queue_wait = 5ms});
    REQUIRE_FALSE(entry);
    CHECK(entry.error() == bulkhead::reject_reason::admission_timeout);
    CHECK(gate.available_slots() == 1);
}

// --- B3 ---------------------------------------------------------------------
TEST_CASE("[B3] a callback that throws anything makes the gate roll back and rethrows it unchanged", "[gate][B3]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);

    SECTION("a std::exception") {
        struct custom : std::runtime_error {
            using std::runtime_error::runtime_error;
            int detail = 17;
        };
        try {
            gate.transaction(0ms, [](fake_pool::work& work) -> int {
                work.write(1);
                throw custom("callback failed");
            });
            FAIL("no exception");
        } catch (const custom& failure) {
            CHECK(failure.detail == 17);
            CHECK(std::string(failure.what()) == "callback failed");
        }
    }
    SECTION("a type that is not a std::exception") {
        CHECK_THROWS_AS(gate.transaction(0ms,
                                         [](fake_pool::work& work) {
                                             work.write(2);
                                             throw not_a_std_exception{3};
                                         }),
                        not_a_std_exception);
    }
    SECTION("through the non-throwing twin as well") {
        CHECK_THROWS_AS(gate.try_transaction(0ms, [](fake_pool::work&) -> int { throw not_a_std_exception{4}; }),
                        not_a_std_exception);
    }
    CHECK(pool.rollbacks == 1);
    CHECK(pool.commits == 0);
    CHECK(pool.committed_values().empty());
    CHECK(gate.available() == 1);
}

// --- B5 ---------------------------------------------------------------------
TEST_CASE("[B5] a commit that fails leaves nothing committed, releases the permits and a healthy pool", "[gate][B5]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    pool.fail_commit = true;
    CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work& work) { work.write(9); }), bulkhead_test::fake_failure);
    CHECK(pool.committed_values().empty());
    CHECK(pool.events() == std::vector<std::string>{"acquire", "begin", "commit", "rollback", "return"});
    CHECK(gate.available() == 1);
    CHECK(pool.in_use == 0);
    pool.fail_commit = false;
    gate.transaction(0ms, [](fake_pool::work& work) { work.write(10); });
    CHECK(pool.committed_values() == std::vector<int>{10});
}

// --- B6 ---------------------------------------------------------------------
TEST_CASE("[B6] a failed rollback keeps the original exception, discards the connection and is reported",
          "[gate][B6]") {
    fake_pool pool;
    bulkhead::db_bulkhead<fake_pool, recording_observer> gate(pool, 1, 0);
    pool.fail_rollback = true;
    CHECK_THROWS_WITH(gate.transaction(0ms, [](fake_pool::work&) -> int { throw std::runtime_error("original"); }),
                      "original");
    CHECK(pool.discarded == 1);
    CHECK(pool.events().back() == "return-discarded");
    CHECK(gate.observer().rollback_failures == 1);
    REQUIRE(gate.observer().last_rollback_failure);
    CHECK_THROWS_AS(std::rethrow_exception(gate.observer().last_rollback_failure), bulkhead_test::fake_failure);
    CHECK(gate.available() == 1);
    CHECK(pool.in_use == 0);
}

// --- B8 ---------------------------------------------------------------------
TEST_CASE("[B8] committing or rolling back inside the callback is refused, then rolled back", "[gate][B8]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    CHECK_THROWS_AS(gate.transaction(0ms,
                                     [](fake_pool::work& work) {
                                         work.write(1);
                                         work.commit();
                                     }),
                    std::logic_error);
    CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work& work) { work.rollback(); }), std::logic_error);
    CHECK(pool.commits == 0);
    CHECK(pool.rollbacks == 2);
    CHECK(pool.committed_values().empty());
    CHECK(gate.available() == 1);
}

// --- the rest of the gate's surface ----------------------------------------------
TEST_CASE("the caller gets the callback's value after commit, and options reach the pool", "[gate][B1]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    auto text = gate.transaction({.queue_wait = 1s, .transaction = {.tag = 5}}, [](fake_pool::work& work) {
        work.write(3);
        return std::string("done");
    });
    CHECK(text == "done");
    CHECK(pool.last_tag == 5);
    CHECK(pool.committed_values() == std::vector<int>{3});
    auto outcome = gate.try_transaction(1s, [](fake_pool::work&) { return 11; });
    REQUIRE(outcome);
    CHECK(*outcome == 11);
    auto nothing = gate.try_transaction(1s, [](fake_pool::work&) {});
    CHECK(nothing.has_value());
}

TEST_CASE("a pool timeout through try_transaction is a result and releases the permits", "[gate][pool]") {
    fake_pool pool;
    bulkhead::db_bulkhead<fake_pool, recording_observer> gate(pool, 1, 0);
    pool.fail_acquire = true;
    auto outcome = gate.try_transaction(0ms, [](fake_pool::work&) { return 1; });
    REQUIRE_FALSE(outcome);
    CHECK(outcome.error() == bulkhead::reject_reason::pool_timeout);
    CHECK(gate.observer().rejected_other == 1);
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 1);
}

TEST_CASE("a deadline shorter than the queue wait bounds the permit wait", "[gate][deadline]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    blocker hold(gate);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(gate.transaction({.queue_wait = 10s, .deadline = start + 50ms}, [](fake_pool::work&) {}),
                    bulkhead::deadline_exceeded);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 50ms);
    CHECK(elapsed < 5s);
    CHECK(gate.available_slots() == 1);
}

TEST_CASE("the observer hears every rejection", "[gate][observer]") {
    fake_pool pool;
    bulkhead::db_bulkhead<fake_pool, recording_observer> gate(pool, 1, 0);
    {
        blocker hold(gate);
        (void)gate.try_enter();
        CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work&) {}), bulkhead::admission_full);
    }
    CHECK(gate.observer().rejected_full == 2);
    gate_t plain(pool, 1, 0);
    static_assert(sizeof(plain) < sizeof(gate) || sizeof(recording_observer) == 0);
}

// --- work in progress: stop requests, deadlines ------------------------------
TEST_CASE("a stop request while the callback runs cancels the work, cancel is asked, nothing is committed",
          "[gate][cancel]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    std::stop_source source;
    std::latch entered(1);

    SECTION("the cancelled statement fails: work_cancelled with the failure nested") {
        auto call = std::async(std::launch::async, [&] {
            gate.transaction({.stop = source.get_token()}, [&](fake_pool::work& work) {
                work.write(1);
                entered.count_down();
                if (!bulkhead_test::eventually([&] { return pool.cancels == 1; })) {  // the server's cancel arrives
                    throw std::runtime_error("no cancel request within 10 s");
                }
                throw bulkhead_test::fake_failure("canceling statement due to user request");
            });
        });
        entered.wait();
        CHECK(gate.available() == 0);
        source.request_stop();
        try {
            call.get();
            FAIL("no exception");
        } catch (const bulkhead::work_cancelled& cancelled) {
            CHECK_THROWS_AS(std::rethrow_if_nested(cancelled), bulkhead_test::fake_failure);
        }
    }
    SECTION("the callback finishes anyway: still work_cancelled, rolled back") {
        auto call = std::async(std::launch::async, [&] {
            return gate.transaction({.stop = source.get_token()}, [&](fake_pool::work& work) {
                work.write(1);
                entered.count_down();
                if (!bulkhead_test::eventually([&] { return pool.cancels == 1; })) {
                    throw std::runtime_error("no cancel request within 10 s");
                }
                return 5;
            });
        });
        entered.wait();
        source.request_stop();
        CHECK_THROWS_AS(call.get(), bulkhead::work_cancelled);
    }
    CHECK(pool.cancels == 1);
    CHECK(pool.commits == 0);
    CHECK(pool.rollbacks == 1);
    CHECK(pool.committed_values().empty());
    CHECK(gate.available() == 1);
    CHECK(pool.in_use == 0);
}

TEST_CASE("work_cancelled is not a rejection, the work had started", "[gate][cancel]") {
    static_assert(!std::is_base_of_v<bulkhead::rejected, bulkhead::work_cancelled>);
    static_assert(!std::is_base_of_v<bulkhead::rejected, bulkhead::work_deadline_exceeded>);
    static_assert(!std::is_base_of_v<bulkhead::rejected, bulkhead::commit_unknown>);
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    std::stop_source source;
    CHECK_THROWS_AS(gate.try_transaction({.stop = source.get_token()},
                                         [&](fake_pool::work&) {
                                             source.request_stop();
                                             return 1;
                                         }),
                    bulkhead::work_cancelled);
}

TEST_CASE("the call's deadline reaches the pool, and a failure it caused says so", "[gate][deadline]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    gate.transaction({.deadline = deadline}, [](fake_pool::work&) {});
    CHECK(pool.last_deadline.load() == deadline);
    gate.transaction(0ms, [](fake_pool::work&) {});
    CHECK(pool.last_deadline.load() == std::chrono::steady_clock::time_point::max());

    try {
        gate.transaction({.deadline = deadline}, [](fake_pool::work&) { throw bulkhead_test::fake_deadline_hit(); });
        FAIL("no exception");
    } catch (const bulkhead::work_deadline_exceeded& exceeded) {
        CHECK_THROWS_AS(std::rethrow_if_nested(exceeded), bulkhead_test::fake_deadline_hit);
    }
    // Without a deadline the same failure is the callback's own, unchanged.
    CHECK_THROWS_AS(gate.transaction(0ms, [](fake_pool::work&) { throw bulkhead_test::fake_deadline_hit(); }),
                    bulkhead_test::fake_deadline_hit);
    CHECK(pool.rollbacks == 2);
    CHECK(gate.available() == 1);
}

TEST_CASE("try_transaction does not swallow a rejection thrown by the callback itself", "[gate][B3]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    gate_t inner(pool, 1, 0);
    CHECK_THROWS_AS(gate.try_transaction(0ms,
                                         [&](fake_pool::work&) {
                                             return inner.transaction(0ms, [&](fake_pool::work&) {
                                                 throw bulkhead::admission_full();
                                                 return 0;
                                             });
                                         }),
                    bulkhead::admission_full);
    CHECK(pool.rollbacks == 2);
}
