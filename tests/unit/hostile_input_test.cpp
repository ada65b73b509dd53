// Hostile input for the core (no database): every public entry point of
// fifo_semaphore, admission_counter, db_bulkhead, permit and result gets bad
// arguments (zero, negative and overflowing capacities; negative, minimal and
// enormous waits; deadlines in the past and in the far future; empty
// callables) and must answer with a clear exception naming the problem, or
// the documented result, and leave every observable count unchanged.
#include "fake_pool.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>

#include "catch.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <latch>
#include <limits>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <tuple>
#include <utility>

using namespace std::chrono_literals;
using bulkhead_test::fake_pool;
using gate_t = bulkhead::db_bulkhead<fake_pool>;
using steady = std::chrono::steady_clock;

namespace {

/// Everything a gate shows from outside, to compare before and after.
struct gate_state {
    int available;
    int slots;
    int waiting;
    int acquired;
    int begun;
    bool operator==(const gate_state&) const = default;
};

gate_state state_of(const gate_t& gate, const fake_pool& pool) {
    return {gate.available(), gate.available_slots(), gate.waiting(), pool.acquired.load(), pool.begun.load()};
}

/// Requests `source`'s stop after `delay`, from its own thread.
class delayed_stop {
public:
    delayed_stop(std::stop_source source, std::chrono::milliseconds delay)
        : m_thread([source, delay]() mutable {
              std::this_thread::sleep_for(delay);  // time itself must pass: the waiter is asleep
              source.request_stop();
          }) {}
    delayed_stop(const delayed_stop&) = delete;
    delayed_stop& operator=(const delayed_stop&) = delete;
    ~delayed_stop() { m_thread.join(); }

private:
    std::thread m_thread;
};

int work_value(fake_pool::work& /*work*/) { return 7; }

}  // namespace

// ---------------------------------------------------------------------------
// fifo_semaphore
// ---------------------------------------------------------------------------

TEST_CASE("hostile, fifo_semaphore refuses negative and oversized counts, naming them", "[hostile][semaphore]") {
    for (const std::int64_t bad :
         {std::int64_t{-1}, std::numeric_limits<std::int64_t>::min(), bulkhead::fifo_semaphore::max_permits + 1,
          std::numeric_limits<std::int64_t>::max()}) {
        INFO("permits " << bad);
        CHECK_THROWS_MATCHES(bulkhead::fifo_semaphore(bad), std::invalid_argument,
                             Catch::Matchers::Message("bulkhead::fifo_semaphore: permits must be in [0, max_permits]"));
    }
    bulkhead::fifo_semaphore empty(0);
    CHECK_FALSE(empty.try_acquire());
    bulkhead::fifo_semaphore largest(bulkhead::fifo_semaphore::max_permits);
    CHECK(largest.available() == bulkhead::fifo_semaphore::max_permits);
    CHECK(largest.try_acquire());
    largest.release();
    CHECK(largest.available() == bulkhead::fifo_semaphore::max_permits);
}

TEST_CASE("hostile, fifo_semaphore waits of zero, negative or minimal length never block and change nothing",
          "[hostile][semaphore][timeout]") {
    bulkhead::fifo_semaphore semaphore(0);
    const auto start = steady::now();
    CHECK_FALSE(semaphore.try_acquire_for(0ns));
    CHECK_FALSE(semaphore.try_acquire_for(-1ns));
    CHECK_FALSE(semaphore.try_acquire_for(std::chrono::nanoseconds::min()));
    CHECK_FALSE(semaphore.try_acquire_for(std::chrono::hours::min()));
    CHECK_FALSE(semaphore.try_acquire_for(std::chrono::duration<double>(-1e300)));
    CHECK_FALSE(semaphore.try_acquire_until(steady::time_point::min()));
    CHECK_FALSE(semaphore.try_acquire_until(steady::time_point{}));  // the clock's epoch: long past
    CHECK_FALSE(semaphore.try_acquire_until(std::chrono::system_clock::time_point::min()));
    std::stop_source source;
    CHECK(semaphore.try_acquire_for(-1s, source.get_token()) == bulkhead::wait_status::timed_out);
    CHECK(semaphore.try_acquire_until(steady::time_point::min(), source.get_token()) ==
          bulkhead::wait_status::timed_out);
    CHECK(steady::now() - start < 1s);
    CHECK(semaphore.available() == 0);
    CHECK(semaphore.waiting() == 0);
    // With a permit free and nobody queued, even the most negative wait succeeds.
    semaphore.release();
    CHECK(semaphore.try_acquire_for(std::chrono::nanoseconds::min()));
    CHECK(semaphore.available() == 0);
}

TEST_CASE("hostile, fifo_semaphore waits too long to represent wait until a stop, and succeed at once when free",
          "[hostile][semaphore][timeout]") {
    bulkhead::fifo_semaphore semaphore(1);
    CHECK(semaphore.try_acquire_for(std::chrono::hours::max()));
    semaphore.release();
    CHECK(semaphore.try_acquire_until(steady::time_point::max()));
    semaphore.release();
    CHECK(semaphore.try_acquire_until(std::chrono::system_clock::time_point::max()));
    // Held: the enormous waits now really wait, and a stop ends them.
    const auto waits_until_stopped = [&](auto&& wait) {
        std::stop_source source;
        const delayed_stop stop(source, 50ms);
        const auto start = steady::now();
        const bulkhead::wait_status status = wait(source.get_token());
        CHECK(status == bulkhead::wait_status::cancelled);
        CHECK(steady::now() - start >= 40ms);
    };
    waits_until_stopped(
        [&](std::stop_token token) { return semaphore.try_acquire_for(std::chrono::hours::max(), token); });
    waits_until_stopped(
        [&](std::stop_token token) { return semaphore.try_acquire_for(std::chrono::nanoseconds::max(), token); });
    waits_until_stopped([&](std::stop_token token) {
        return semaphore.try_acquire_for(std::chrono::duration<double>(std::numeric_limits<double>::infinity()), token);
    });
    waits_until_stopped(
        [&](std::stop_token token) { return semaphore.try_acquire_until(steady::time_point::max(), token); });
    waits_until_stopped([&](std::stop_token token) {
        return semaphore.try_acquire_until(std::chrono::system_clock::time_point::max(), token);
    });
    CHECK(semaphore.available() == 0);
    CHECK(semaphore.waiting() == 0);
    semaphore.release();
    CHECK(semaphore.available() == 1);
}

TEST_CASE("hostile, fifo_semaphore release of zero permits changes nothing", "[hostile][semaphore]") {
    bulkhead::fifo_semaphore semaphore(2);
    semaphore.release(0);
    CHECK(semaphore.available() == 2);
}

// ---------------------------------------------------------------------------
// admission_counter
// ---------------------------------------------------------------------------

TEST_CASE("hostile, admission_counter refuses negative and oversized capacities, naming them", "[hostile][counter]") {
    CHECK_THROWS_MATCHES(bulkhead::admission_counter(-1), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::admission_counter: capacity must not be negative"));
    CHECK_THROWS_MATCHES(bulkhead::admission_counter(std::numeric_limits<std::int64_t>::min()), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::admission_counter: capacity must not be negative"));
    CHECK_THROWS_MATCHES(bulkhead::admission_counter(bulkhead::admission_counter::max_capacity + 1),
                         std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::admission_counter: capacity above max_capacity"));
    bulkhead::admission_counter none(0);
    CHECK_FALSE(none.try_acquire());
    CHECK(none.available() == 0);
}

// ---------------------------------------------------------------------------
// db_bulkhead: construction
// ---------------------------------------------------------------------------

TEST_CASE("hostile, a gate refuses every impossible B and Q, naming which, and builds nothing", "[hostile][gate][A1]") {
    fake_pool pool;
    constexpr int int_max = std::numeric_limits<int>::max();
    constexpr int int_min = std::numeric_limits<int>::min();
    for (const int concurrent : {0, -1, int_min}) {
        INFO("B " << concurrent);
        CHECK_THROWS_MATCHES(gate_t(pool, concurrent, 0), std::invalid_argument,
                             Catch::Matchers::Message("bulkhead::db_bulkhead: concurrent (B) must be at least 1"));
    }
    for (const int extra : {-1, int_min}) {
        INFO("Q " << extra);
        CHECK_THROWS_MATCHES(gate_t(pool, 1, extra), std::invalid_argument,
                             Catch::Matchers::Message("bulkhead::db_bulkhead: extra_slots (Q) must not be negative"));
    }
    CHECK_THROWS_AS(gate_t(pool, 0, -1), std::invalid_argument);  // both wrong: still one clear error
    for (const auto& [concurrent, extra] :
         {std::pair{int_max, 1}, std::pair{1, int_max}, std::pair{int_max, int_max}}) {
        INFO("B " << concurrent << ", Q " << extra);
        CHECK_THROWS_MATCHES(
            gate_t(pool, concurrent, extra), std::overflow_error,
            Catch::Matchers::Message("bulkhead::db_bulkhead: concurrent + extra_slots (B + Q) overflows int"));
    }
    CHECK(pool.acquired == 0);
    gate_t largest(pool, int_max, 0);
    CHECK(largest.available() == int_max);
    CHECK(largest.available_slots() == int_max);
}

// ---------------------------------------------------------------------------
// db_bulkhead: per-call arguments
// ---------------------------------------------------------------------------

TEST_CASE("hostile, negative queue waits are refused by every entry point before anything is taken",
          "[hostile][gate][A2]") {
    fake_pool pool;
    gate_t gate(pool, 2, 1);
    const gate_state before = state_of(gate, pool);
    for (const std::chrono::nanoseconds bad : {-1ns, std::chrono::nanoseconds(-1s), std::chrono::nanoseconds::min()}) {
        INFO("queue_wait " << bad.count() << " ns");
        const auto message = Catch::Matchers::Message("bulkhead::db_bulkhead: queue_wait must not be negative");
        CHECK_THROWS_MATCHES(gate.transaction(bad, work_value), std::invalid_argument, message);
        CHECK_THROWS_MATCHES(gate.try_transaction(bad, work_value), std::invalid_argument, message);
        CHECK_THROWS_MATCHES(gate.transaction({.queue_wait = bad}, work_value), std::invalid_argument, message);
        CHECK_THROWS_MATCHES(gate.enter({.queue_wait = bad}), std::invalid_argument, message);
        CHECK_THROWS_MATCHES(gate.try_enter({.queue_wait = bad}), std::invalid_argument, message);
        // Misuse is reported before a stop or a deadline is looked at.
        std::stop_source stopped;
        stopped.request_stop();
        CHECK_THROWS_AS(gate.transaction({.queue_wait = bad, .stop = stopped.get_token()}, work_value),
                        std::invalid_argument);
        CHECK_THROWS_AS(gate.transaction({.queue_wait = bad, .deadline = steady::time_point{}}, work_value),
                        std::invalid_argument);
    }
    CHECK(state_of(gate, pool) == before);
}

TEST_CASE("hostile, empty callables are refused before anything is taken", "[hostile][gate][A2]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    const gate_state before = state_of(gate, pool);
    int (*null_function)(fake_pool::work&) = nullptr;
    std::function<int(fake_pool::work&)> empty_function;
    std::function<void(fake_pool::work&)> empty_void;
    CHECK_THROWS_MATCHES(gate.transaction(1s, null_function), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::db_bulkhead: the callback is a null function pointer"));
    CHECK_THROWS_MATCHES(gate.try_transaction(1s, null_function), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::db_bulkhead: the callback is a null function pointer"));
    CHECK_THROWS_MATCHES(gate.transaction(1s, empty_function), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::db_bulkhead: the callback is empty"));
    CHECK_THROWS_MATCHES(gate.try_transaction(1s, empty_void), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead::db_bulkhead: the callback is empty"));
    // Refused even when the gate is full: misuse is not a rejection.
    bulkhead::permit held = gate.enter();
    CHECK_THROWS_AS(gate.transaction(0ns, empty_function), std::invalid_argument);
    held.release();
    CHECK(state_of(gate, pool) == before);
}

TEST_CASE("hostile, deadlines in the past are refused with deadline_exceeded before the pool is touched",
          "[hostile][gate][deadline]") {
    fake_pool pool;
    bulkhead::db_bulkhead<fake_pool, bulkhead_test::recording_observer> gate(pool, 1, 1);
    const auto before = std::tuple{gate.available(), gate.available_slots(), gate.waiting()};
    for (const steady::time_point past :
         {steady::time_point{}, steady::time_point{} + 1ns, steady::now() - 1h, steady::now() - 1ns, steady::now()}) {
        CHECK_THROWS_AS(gate.transaction({.queue_wait = 1s, .deadline = past}, work_value),
                        bulkhead::deadline_exceeded);
        const auto answer = gate.try_transaction({.queue_wait = 1s, .deadline = past}, work_value);
        REQUIRE_FALSE(answer);
        CHECK(answer.error() == bulkhead::reject_reason::deadline_exceeded);
        CHECK_THROWS_AS(gate.enter({.deadline = past}), bulkhead::deadline_exceeded);
        CHECK_FALSE(gate.try_enter({.deadline = past}));
    }
    CHECK(std::tuple{gate.available(), gate.available_slots(), gate.waiting()} == before);
    CHECK(pool.acquired == 0);
    CHECK(gate.observer().rejected_other == 20);
}

TEST_CASE("hostile, enormous waits and far deadlines do not overflow, a free permit is taken at once",
          "[hostile][gate][timeout]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    const auto start = steady::now();
    CHECK(gate.transaction(std::chrono::nanoseconds::max(), work_value) == 7);
    CHECK(gate.transaction({.queue_wait = std::chrono::nanoseconds::max(), .deadline = steady::time_point::max()},
                           work_value) == 7);
    const steady::time_point far = steady::time_point::max() - 1ns;
    CHECK(gate.transaction({.queue_wait = 1s, .deadline = far}, work_value) == 7);
    CHECK(pool.last_deadline.load() == far);  // handed to the pool as it was
    CHECK(gate.transaction({.queue_wait = std::chrono::nanoseconds::max(), .deadline = far}, work_value) == 7);
    CHECK(steady::now() - start < 1s);
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 2);
}

TEST_CASE("hostile, an enormous queue wait behind a held permit really waits, and a stop ends it",
          "[hostile][gate][timeout]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    std::latch entered(1);
    std::latch leave(1);
    std::thread holder([&] {  // holds the only permit (on its own thread: the gate is not reentrant)
        bulkhead::permit held = gate.enter();
        entered.count_down();
        leave.wait();
    });
    entered.wait();
    std::stop_source source;
    {
        const delayed_stop stop(source, 50ms);
        const auto start = steady::now();
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = std::chrono::nanoseconds::max(), .stop = source.get_token()}, work_value),
            bulkhead::admission_cancelled);
        CHECK(steady::now() - start >= 40ms);
    }
    CHECK(gate.available_slots() == 1);  // only the held permit's slot is taken
    leave.count_down();
    holder.join();
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 2);
    CHECK(pool.acquired == 0);
}

// ---------------------------------------------------------------------------
// permit and result
// ---------------------------------------------------------------------------

TEST_CASE("hostile, empty, moved-from and self-assigned permits release nothing twice", "[hostile][permit][A15]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    bulkhead::permit empty;
    empty.release();
    empty.release();
    CHECK_FALSE(empty);
    bulkhead::permit held = gate.enter();
    auto& alias = held;
    held = std::move(alias);  // self-move: keeps what it holds
    CHECK(held);
    CHECK(gate.available() == 0);
    bulkhead::permit moved = std::move(held);
    held.release();  // NOLINT(bugprone-use-after-move): a moved-from permit is empty, on purpose
    CHECK(gate.available() == 0);
    moved.release();
    moved.release();
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 1);
}

TEST_CASE("hostile, value() of a rejected result throws the matching rejection", "[hostile][result]") {
    for (const auto reason : {bulkhead::reject_reason::admission_full, bulkhead::reject_reason::admission_timeout,
                              bulkhead::reject_reason::admission_cancelled, bulkhead::reject_reason::pool_timeout,
                              bulkhead::reject_reason::deadline_exceeded}) {
        INFO(bulkhead::to_string(reason));
        const bulkhead::result<int> rejected = reason;
        CHECK_FALSE(rejected);
        CHECK(rejected.error() == reason);
        try {
            (void)rejected.value();
            FAIL("value() of a rejection returned");
        } catch (const bulkhead::rejected& thrown) {
            CHECK(thrown.reason() == reason);
        }
        const bulkhead::result<void> rejected_void = reason;
        CHECK_THROWS_AS(rejected_void.value(), bulkhead::rejected);
    }
    CHECK(bulkhead::to_string(static_cast<bulkhead::reject_reason>(200)) == "unknown");
}

TEST_CASE("hostile, absolute waits at coarse max() time points wait instead of overflowing", "[hostile][semaphore]") {
    bulkhead::fifo_semaphore semaphore(0);
    std::stop_source source;
    bulkhead::wait_status status = bulkhead::wait_status::timed_out;
    std::thread waiter([&] {
        status =
            semaphore.try_acquire_until(std::chrono::time_point<steady, std::chrono::hours>::max(), source.get_token());
    });
    bulkhead_test::await([&] { return semaphore.waiting() == 1; });  // it waits: no instant time-out
    semaphore.release();
    waiter.join();
    CHECK(status == bulkhead::wait_status::acquired);
}

TEST_CASE("hostile, a NaN wait does not wait", "[hostile][semaphore]") {
    bulkhead::fifo_semaphore semaphore(0);
    const std::chrono::duration<double> not_a_number(std::numeric_limits<double>::quiet_NaN());
    CHECK_FALSE(semaphore.try_acquire_for(not_a_number));
    CHECK(semaphore.waiting() == 0);
}

TEST_CASE("hostile, a deadline of time_point::min() is refused as passed", "[hostile][gate][deadline]") {
    bulkhead_test::fake_pool pool;
    bulkhead::db_bulkhead<bulkhead_test::fake_pool> gate(pool, 1, 0);
    CHECK_THROWS_AS(gate.transaction({.deadline = steady::time_point::min()}, [](bulkhead_test::fake_pool::work&) {}),
                    bulkhead::deadline_exceeded);
    CHECK(gate.available() == 1);
    CHECK(pool.acquired == 0);
}
