// Contract F, the parts that need no database: coroutine (and other Asio
// completion token) callers of a gate with the test-double pool. F3 with a
// server is in tests/pg/async_pg_test.cpp, F10 in tests/pg/http_service_test.cpp.
// The temporaries passed inside co_await expressions here (options with an
// empty stop token, lambdas capturing references) are trivially destructible:
// g++ 12's double destruction of such temporaries (docs/async.md) does them
// no harm.
#include "adaptive_checks.hpp"
#include "asio_support.hpp"
#include "fake_pool.hpp"
#include "gate_blocker.hpp"
#include "test_util.hpp"

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using bulkhead::reject_reason;
using bulkhead::work_error;
using bulkhead_test::fake_pool;
using bulkhead_test::io_thread;
using gate_t = bulkhead::db_bulkhead<fake_pool>;

namespace {

/// The outcome of one asynchronous call with a callback token.
struct outcome {
    std::atomic<bool> done{false};
    std::error_code code;
    int value = -1;
    std::thread::id thread;

    auto handler() {
        return [this](std::error_code ec, int v) {
            code = ec;
            value = v;
            thread = std::this_thread::get_id();
            done.store(true, std::memory_order_release);
        };
    }
    [[nodiscard]] bool finished() const noexcept { return done.load(std::memory_order_acquire); }
};

/// A callback that holds its permit until released.
struct held_work {
    std::latch entered{1};
    std::latch release{1};
    std::atomic<std::thread::id> thread{};

    auto callback() {
        return [this](fake_pool::work&) {
            thread = std::this_thread::get_id();
            entered.count_down();
            release.wait();
            return 7;
        };
    }
};

/// The threads of this process (Linux: /proc/self/status).
int process_threads() {
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
        if (key == "Threads:") {
            int count = 0;
            status >> count;
            return count;
        }
    }
    return -1;
}

}  // namespace

TEST_CASE("[F1] threads and coroutines share the slots and permits, granted in arrival order across both kinds",
          "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 4);
    io_thread io;
    std::mutex order_mutex;
    std::vector<std::string> order;
    auto record = [&](const char* who) {
        return [&order_mutex, &order, who](fake_pool::work&) {
            const std::lock_guard lock(order_mutex);
            order.emplace_back(who);
            return 0;
        };
    };

    bulkhead_test::blocker<gate_t> busy(gate);  // holds the one permit
    std::vector<std::thread> threads;
    std::vector<std::unique_ptr<outcome>> coroutines;
    struct arrival {
        const char* who;
        bool thread;
    };
    int queued = 0;
    for (const arrival next : {arrival{"thread-1", true}, arrival{"coroutine-1", false}, arrival{"thread-2", true},
                               arrival{"coroutine-2", false}}) {
        if (next.thread) {
            threads.emplace_back([&gate, &record, next] { gate.transaction(10s, record(next.who)); });
        } else {
            coroutines.push_back(std::make_unique<outcome>());
            asio::co_spawn(
                io.executor(),
                [&gate, &record, next, out = coroutines.back().get()]() -> asio::awaitable<void> {
                    auto [ec, v] = co_await gate.async_transaction({.queue_wait = 10s}, record(next.who),
                                                                   bulkhead_test::as_tuple(asio::use_awaitable));
                    out->code = ec;
                    out->value = v;
                    out->done = true;
                },
                asio::detached);
        }
        ++queued;
        bulkhead_test::await([&] { return gate.waiting() == queued; });  // arrival order fixed
    }
    // One running and four queued: the B + Q slots are all taken, for both kinds.
    CHECK(gate.available_slots() == 0);
    outcome refused;
    gate.async_transaction({.queue_wait = 10s}, record("refused"), refused.handler());
    bulkhead_test::await([&] { return refused.finished(); });
    CHECK(refused.code == reject_reason::admission_full);
    CHECK_THROWS_AS(gate.transaction(10s, record("refused")), bulkhead::admission_full);

    busy.go();
    for (std::thread& thread : threads) {
        thread.join();
    }
    for (const auto& out : coroutines) {
        bulkhead_test::await([&] { return out->done.load(); });
        CHECK(!out->code);
    }
    CHECK(order == std::vector<std::string>{"thread-1", "coroutine-1", "thread-2", "coroutine-2"});
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 5);
}

TEST_CASE("[F2] cancelling a waiting coroutine ends it with admission_cancelled and returns only its slot",
          "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 2);
    io_thread io;
    bulkhead_test::blocker<gate_t> busy(gate);
    const int acquired_before = pool.acquired;

    SECTION("by Asio per-operation cancellation") {
        asio::cancellation_signal signal;
        outcome out;
        asio::post(io.executor(), [&] {
            gate.async_transaction(
                {.queue_wait = 10s}, [](fake_pool::work&) { return 1; },
                asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io.executor(), out.handler())));
        });
        bulkhead_test::await([&] { return gate.waiting() == 1; });
        CHECK(gate.available_slots() == 1);
        // Emitted on the handler's executor, as Asio's own operations expect.
        asio::post(io.executor(), [&] { signal.emit(asio::cancellation_type::terminal); });
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_cancelled);
        CHECK(bulkhead::is_rejection(out.code));
    }
    SECTION("by a coroutine's cancellation: the losing side of an awaitable ||") {
        using namespace asio::experimental::awaitable_operators;
        outcome out;
        asio::co_spawn(
            io.executor(),
            [&]() -> asio::awaitable<void> {
                asio::steady_timer timer(co_await asio::this_coro::executor, 50ms);
                auto winner = co_await (gate.async_transaction(
                                            {.queue_wait = 10s}, [](fake_pool::work&) { return 1; },
                                            bulkhead_test::as_tuple(asio::use_awaitable)) ||
                                        timer.async_wait(asio::use_awaitable));
                out.value = static_cast<int>(winner.index());
                out.done = true;
            },
            asio::detached);
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.value == 1);  // the timer won; the transaction was cancelled while queued
    }
    // Only the slot came back: the running call still holds the one permit.
    CHECK(gate.waiting() == 0);
    CHECK(gate.available_slots() == 2);
    CHECK(gate.available() == 0);
    CHECK(pool.acquired == acquired_before);  // the cancelled call never reached the pool
    CHECK(gate.stats().rejected[static_cast<std::size_t>(reject_reason::admission_cancelled)] == 1);
    busy.go();
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 3);
}

TEST_CASE(
    "[F3] cancelling while the work runs asks the pool to cancel, and the permits stay held until cleanup "
    "(test-double pool, the server's part is in the [pg] suite)",
    "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    io_thread io;
    asio::cancellation_signal signal;
    held_work work;
    outcome out;
    std::exception_ptr failure;
    asio::post(io.executor(), [&] {
        gate.async_transaction(
            {}, work.callback(), failure,
            asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io.executor(), out.handler())));
    });
    work.entered.wait();
    asio::post(io.executor(), [&] { signal.emit(asio::cancellation_type::terminal); });
    bulkhead_test::await([&] { return pool.cancels == 1; });
    CHECK(gate.available() == 0);  // asked to cancel, not released
    CHECK_FALSE(out.finished());
    work.release.count_down();
    bulkhead_test::await([&] { return out.finished(); });
    CHECK(out.code == work_error::work_cancelled);
    CHECK_FALSE(bulkhead::is_rejection(out.code));
    REQUIRE(failure);
    CHECK_THROWS_AS(std::rethrow_exception(failure), bulkhead::work_cancelled);
    CHECK(pool.commits == 0);
    CHECK(pool.rollbacks == 1);
    CHECK(pool.in_use == 0);
    CHECK(gate.available() == 1);
}

TEST_CASE("[F4] deadline and stop in the options behave as in the blocking API", "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 3);
    io_thread io;
    bulkhead_test::blocker<gate_t> busy(gate);
    auto work = [](fake_pool::work&) { return 1; };

    SECTION("the queue wait ends with admission_timeout") {
        outcome out;
        const auto start = std::chrono::steady_clock::now();
        gate.async_transaction({.queue_wait = 30ms}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(out.code == reject_reason::admission_timeout);
        CHECK(took >= 30ms);
        CHECK(took < 5s);
    }
    SECTION("a deadline shorter than the queue wait ends it with deadline_exceeded") {
        outcome out;
        gate.async_transaction({.queue_wait = 10s, .deadline = std::chrono::steady_clock::now() + 30ms}, work,
                               out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::deadline_exceeded);
    }
    SECTION("a deadline already passed is refused at once") {
        outcome out;
        gate.async_transaction({.deadline = std::chrono::steady_clock::now() - 1ms}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::deadline_exceeded);
    }
    SECTION("a zero queue wait with no permit free is admission_timeout at once") {
        outcome out;
        gate.async_transaction({}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_timeout);
    }
    SECTION("a stop while queued ends it with admission_cancelled") {
        std::stop_source stop;
        outcome out;
        gate.async_transaction({.queue_wait = 10s, .stop = stop.get_token()}, work, out.handler());
        bulkhead_test::await([&] { return gate.waiting() == 1; });
        stop.request_stop();
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_cancelled);
    }
    SECTION("a stop already requested is refused at once") {
        std::stop_source stop;
        stop.request_stop();
        outcome out;
        gate.async_transaction({.queue_wait = 10s, .stop = stop.get_token()}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_cancelled);
    }
    CHECK(gate.waiting() == 0);
    CHECK(gate.available_slots() == 3);
    busy.go();

    SECTION("a stop while the work runs cancels it: work_cancelled, rolled back") {
        std::stop_source stop;
        held_work held;
        outcome out;
        gate.async_transaction({.stop = stop.get_token()}, held.callback(), out.handler());
        held.entered.wait();
        stop.request_stop();
        CHECK(pool.cancels == 1);
        held.release.count_down();
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == work_error::work_cancelled);
        CHECK(pool.commits == 1);  // the blocker's only
    }
    SECTION("a deadline that passes while the work runs: work_deadline_exceeded, rolled back") {
        held_work held;
        outcome out;
        gate.async_transaction({.deadline = std::chrono::steady_clock::now() + 30ms}, held.callback(), out.handler());
        held.entered.wait();
        std::this_thread::sleep_for(40ms);  // the deadline itself is what is tested: it must pass
        held.release.count_down();
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == work_error::work_deadline_exceeded);
        CHECK(pool.commits == 1);  // the blocker's only
    }
    CHECK(gate.available() == 1);
}

TEST_CASE(
    "[G8] a coroutine whose deadline is shorter than the expected queue wait is refused at admission, as a "
    "thread is",
    "[unit][async][G8]") {
    fake_pool pool;
    gate_t gate(pool, 1, 3);
    // One finished transaction: the mean permit hold starts there.
    namespace timing = bulkhead_test::early_refusal;
    gate.transaction(0ms, [](fake_pool::work&) { std::this_thread::sleep_for(timing::hold); });
    bulkhead_test::blocker<gate_t> busy(gate);
    REQUIRE(gate.expected_queue_wait() >= timing::hold);
    auto work = [](fake_pool::work&) { return 1; };
    SECTION("deadline_exceeded at once, counted as early, the slot back") {
        outcome out;
        const auto start = std::chrono::steady_clock::now();
        gate.async_transaction({.queue_wait = 10s, .deadline = start + timing::deadline}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(std::chrono::steady_clock::now() - start < timing::bound);  // it did not wait its deadline out
        CHECK(out.code == reject_reason::deadline_exceeded);
        CHECK(gate.stats().deadline_rejected_early == 1);
    }
    SECTION("reject_unreachable_deadline = false queues it until the deadline") {
        outcome out;
        const auto start = std::chrono::steady_clock::now();
        gate.async_transaction(
            {.queue_wait = 10s, .deadline = start + timing::deadline, .reject_unreachable_deadline = false}, work,
            out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(std::chrono::steady_clock::now() - start >= timing::deadline);
        CHECK(out.code == reject_reason::deadline_exceeded);
        CHECK(gate.stats().deadline_rejected_early == 0);
    }
    CHECK(gate.available_slots() == 3);
}

TEST_CASE(
    "[G9] a coroutine's rejection carries the retry delay a thrown one would: the failure overload receives the "
    "rejected exception",
    "[unit][async][G9]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    // One finished transaction: the mean permit hold starts there.
    gate.transaction(0ms, [](fake_pool::work&) { std::this_thread::sleep_for(20ms); });
    bulkhead_test::blocker<gate_t> busy(gate);
    auto work = [](fake_pool::work&) { return 1; };
    using rejection_figures = std::pair<reject_reason, std::chrono::milliseconds>;
    const auto rejection_of = [](const std::exception_ptr& failure) -> rejection_figures {
        try {
            std::rethrow_exception(failure);
        } catch (const bulkhead::rejected& rejection) {
            return {rejection.reason(), rejection.retry_after()};
        }
    };
    // One call that must be refused with `reason`: what its `failure` got
    // (filled beforehand, to show that the rejection replaces it).
    const auto refused = [&](const gate_t::options& call, reject_reason reason) {
        outcome out;
        std::exception_ptr failure = std::make_exception_ptr(std::runtime_error("stale"));
        gate.async_transaction(call, work, failure, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reason);
        REQUIRE(failure);
        CHECK(rejection_of(failure).first == reason);
        return failure;
    };
    SECTION("refused at the slot (B + Q taken): at once") {
        outcome waiting;
        gate.async_transaction({.queue_wait = 10s}, work, waiting.handler());  // the last slot
        bulkhead_test::await([&] { return gate.waiting() == 1; });
        const std::exception_ptr failure = refused({.queue_wait = 10s}, reject_reason::admission_full);
        CHECK_THROWS_AS(std::rethrow_exception(failure), bulkhead::admission_full);
        CHECK(rejection_of(failure).second >= 20ms * 3);  // 1 running, 1 queued and this one, on one permit
        CHECK(rejection_of(failure).second == gate.suggested_retry_delay());
        busy.go();
        bulkhead_test::await([&] { return waiting.finished(); });
        CHECK(waiting.code == std::error_code());
        CHECK(gate.available_slots() == 2);
    }
    SECTION("refused after its queue wait: the delay of the moment it left") {
        const std::exception_ptr failure = refused({.queue_wait = 1ms}, reject_reason::admission_timeout);
        CHECK(rejection_of(failure).second >= 20ms * 2);  // 1 running and one more
        CHECK(rejection_of(failure).second == gate.suggested_retry_delay());
        CHECK(gate.available_slots() == 1);  // the blocker's own
    }
    SECTION("refused for a deadline it could not meet: at once") {
        const std::exception_ptr failure = refused(
            {.queue_wait = 10s, .deadline = std::chrono::steady_clock::now() + 5ms}, reject_reason::deadline_exceeded);
        CHECK_THROWS_AS(std::rethrow_exception(failure), bulkhead::deadline_exceeded);
        CHECK(rejection_of(failure).second == gate.suggested_retry_delay());
        CHECK(gate.available_slots() == 1);  // the blocker's own
    }
    SECTION("refused by the pool (no connection in time): the pool's rejection with the gate's delay") {
        busy.go();
        pool.fail_acquire = true;
        const std::exception_ptr failure = refused({}, reject_reason::pool_timeout);
        CHECK_THROWS_WITH(std::rethrow_exception(failure), "fake_pool: no connection");  // the pool's message
        // Stamped while the call held its permit: (1 running + 1) x the mean,
        // which the blocker's short hold has just pulled a little below 20 ms.
        CHECK(rejection_of(failure).second >= 30ms);
    }
    SECTION("a call that commits leaves `failure` empty") {
        busy.go();
        outcome out;
        std::exception_ptr failure = std::make_exception_ptr(std::runtime_error("stale"));
        gate.async_transaction({}, work, failure, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == std::error_code());
        CHECK_FALSE(failure);
    }
    SECTION("without the overload, the same delay is the gate's to read") {
        outcome out;
        gate.async_transaction({.queue_wait = 0ms}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_timeout);
        CHECK(gate.suggested_retry_delay() >= 20ms * 2);
        CHECK(gate.available_slots() == 1);  // the blocker's own
    }
}

TEST_CASE("[F5] losing interest in the result (a destroyed future, a stopped event loop) never frees permits early",
          "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 1);
    held_work work;

    SECTION("the future is destroyed while the work runs") {
        {
            auto result = gate.async_transaction({}, work.callback(), asio::use_future);
            work.entered.wait();
        }  // the future is gone
        CHECK(gate.available() == 0);
        CHECK(gate.available_slots() == 1);
        work.release.count_down();
        bulkhead_test::await([&] { return gate.available() == 1; });
        CHECK(pool.commits == 1);  // the work was not shortened either
    }
    SECTION("the awaiting coroutine's event loop stops and is destroyed while the work runs") {
        std::atomic<bool> resumed{false};
        {
            asio::io_context io;
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    co_await gate.async_transaction({}, work.callback(), asio::use_awaitable);
                    resumed = true;
                },
                asio::detached);
            std::thread loop([&] { io.run_one(); });  // starts the coroutine, which suspends in the gate
            work.entered.wait();
            io.stop();
            loop.join();
            CHECK(gate.available() == 0);
            work.release.count_down();
            bulkhead_test::await([&] { return gate.available() == 1; });
            CHECK(pool.commits == 1);
            CHECK(pool.in_use == 0);
            // The permits come back before the completion is posted; the
            // context may go only once the work thread is done posting (a
            // stopped context does not wait for its outstanding work).
            bulkhead_test::await([&] { return bulkhead::detail::async_access::core(gate).workers().idle() == 1; });
        }  // the io_context goes with the posted completion, and the coroutine frame with it
        CHECK_FALSE(resumed);
        CHECK(gate.available_slots() == 2);
    }
}

TEST_CASE("[F6] a waiting coroutine holds no thread, and the callback never runs on the caller's event-loop thread",
          "[unit][async]") {
    fake_pool pool;
    constexpr int concurrent = 2;
    constexpr int waiters = 2000;
    gate_t gate(pool, concurrent, waiters);
    io_thread io;
    // The work threads start with the first asynchronous call.
    auto first = gate.async_transaction(
        {}, [](fake_pool::work&) { return std::this_thread::get_id(); }, asio::use_future);
    CHECK(first.get() != io.id());
    const int threads_before = process_threads();

    held_work hold_one;
    held_work hold_two;
    auto busy_one = gate.async_transaction({}, hold_one.callback(), asio::use_future);
    auto busy_two = gate.async_transaction({}, hold_two.callback(), asio::use_future);
    hold_one.entered.wait();
    hold_two.entered.wait();

    std::atomic<int> on_loop_thread{0};
    std::atomic<int> finished{0};
    for (int i = 0; i < waiters; ++i) {
        asio::co_spawn(
            io.executor(),
            [&]() -> asio::awaitable<void> {
                const auto loop = std::this_thread::get_id();
                auto [ec, ran_on] = co_await gate.async_transaction(
                    {.queue_wait = 30s}, [](fake_pool::work&) { return std::this_thread::get_id(); },
                    bulkhead_test::as_tuple(asio::use_awaitable));
                if (!ec && ran_on == loop) {
                    ++on_loop_thread;
                }
                ++finished;
            },
            asio::detached);
    }
    bulkhead_test::await([&] { return gate.waiting() == waiters; });
    // Every waiter is parked, and the one event-loop thread is free.
    std::promise<void> loop_free;
    asio::post(io.executor(), [&] { loop_free.set_value(); });
    CHECK(loop_free.get_future().wait_for(10s) == std::future_status::ready);
    CHECK(process_threads() == threads_before);  // no thread per waiter

    hold_one.release.count_down();
    hold_two.release.count_down();
    busy_one.get();
    busy_two.get();
    bulkhead_test::await([&] { return finished == waiters; });
    CHECK(on_loop_thread == 0);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == concurrent + waiters);
}

TEST_CASE("[K8] a completion's error code is its Asio's own type, holding the bulkhead reason", "[unit][async]") {
    // Built twice (tests/async/CMakeLists.txt): over standalone Asio the
    // type is std::error_code; over Boost.Asio boost::system::error_code,
    // the type Boost's use_awaitable and use_future throw with.
    // use_future is not used here: its promise is destroyed on Asio's
    // system thread, and TSan, blind to libstdc++'s exception reference
    // counts, would report the thrown error's release as a race.
    using asio_error_code = std::remove_cvref_t<decltype(std::declval<bulkhead_test::asio_system_error>().code())>;
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    bulkhead_test::blocker<gate_t> busy(gate);  // the one slot is taken
    auto work = [](fake_pool::work&) { return 1; };

    std::promise<asio_error_code> seen;
    gate.async_transaction({}, work, [&](auto ec, int) {
        static_assert(std::is_same_v<decltype(ec), asio_error_code>);
        seen.set_value(ec);
    });
    const asio_error_code code = seen.get_future().get();
    CHECK(code == reject_reason::admission_full);
    CHECK(bulkhead::is_rejection(code));
    CHECK(bulkhead::rejection_of(code) == reject_reason::admission_full);

    // What use_awaitable throws is this Asio's system_error: [F7], which
    // catches it as bulkhead_test::asio_system_error.

    // Success is the default error code, equal to a default-constructed one.
    busy.go();
    bulkhead_test::await([&] { return gate.available_slots() == 1; });  // the blocker is out
    std::promise<asio_error_code> succeeded;
    gate.async_transaction({}, work, [&](asio_error_code ec, int) { succeeded.set_value(ec); });
    const asio_error_code none = succeeded.get_future().get();
    CHECK_FALSE(none);
    CHECK(none == asio_error_code());
    CHECK(none.value() == 0);
}

TEST_CASE("[F7] rejections complete with a bulkhead error code, and the throwing form raises a system_error naming it",
          "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    io_thread io;
    bulkhead_test::blocker<gate_t> busy(gate);  // the one slot is taken
    auto work = [](fake_pool::work&) { return 1; };

    SECTION("a callback token") {
        outcome out;
        gate.async_transaction({}, work, out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == reject_reason::admission_full);
        CHECK(out.code.category() == bulkhead::error_category());
        CHECK(std::string(out.code.category().name()) == "bulkhead");
        REQUIRE(bulkhead::is_rejection(out.code));
        CHECK(bulkhead::rejection_of(out.code) == reject_reason::admission_full);
        CHECK(out.value == 0);  // T{} with an error
    }
    SECTION("use_awaitable throws a system_error; as_tuple does not") {
        auto thrown = asio::co_spawn(
            io.executor(),
            [&]() -> asio::awaitable<std::string> {
                auto [ec, v] = co_await gate.async_transaction({}, work, bulkhead_test::as_tuple(asio::use_awaitable));
                if (ec != reject_reason::admission_full || v != 0) {
                    co_return "as_tuple: " + ec.message();
                }
                try {
                    co_await gate.async_transaction({}, work, asio::use_awaitable);
                } catch (const bulkhead_test::asio_system_error& error) {
                    if (error.code() != reject_reason::admission_full) {
                        co_return "wrong code";
                    }
                    co_return error.what();
                }
                co_return "nothing thrown";
            },
            asio::use_future);
        const std::string what = thrown.get();
        CHECK_THAT(what, Catch::Matchers::ContainsSubstring("admission_full"));
    }
    SECTION("deferred: nothing is taken until launched") {
        busy.go();
        auto op = gate.async_transaction({}, work, bulkhead_test::deferred);
        CHECK(gate.available_slots() == 1);
        CHECK(pool.acquired == 1);  // only the blocker's
        auto launched = std::move(op)(asio::use_future);
        CHECK(launched.get() == 1);
    }
    SECTION("misuse throws at once, before anything is taken") {
        CHECK_THROWS_AS(gate.async_transaction({.queue_wait = -1ms}, work, asio::use_future), std::invalid_argument);
        std::function<int(fake_pool::work&)> empty;
        CHECK_THROWS_AS(gate.async_transaction({}, empty, asio::use_future), std::invalid_argument);
    }
    SECTION("a failure of the work is work_failed, its exception kept") {
        busy.go();
        outcome out;
        std::exception_ptr failure;
        gate.async_transaction(
            {}, [](fake_pool::work&) -> int { throw std::runtime_error("the callback's own"); }, failure,
            out.handler());
        bulkhead_test::await([&] { return out.finished(); });
        CHECK(out.code == work_error::work_failed);
        REQUIRE(failure);
        CHECK_THROWS_WITH(std::rethrow_exception(failure), "the callback's own");
        CHECK(pool.rollbacks == 1);
    }
}

TEST_CASE("[F7] an observer hears each asynchronous rejection once, as the gate's counters count it", "[unit][async]") {
    fake_pool pool;
    bulkhead::db_bulkhead<fake_pool, bulkhead_test::recording_observer> gate(pool, 1, 1);
    io_thread io;
    bulkhead_test::blocker<decltype(gate)> busy(gate);  // the permit and one slot
    auto work = [](fake_pool::work&) { return 1; };

    outcome waited;  // takes the last slot, waits, times out
    gate.async_transaction({.queue_wait = 200ms}, work, waited.handler());
    outcome full;  // finds no slot
    gate.async_transaction({}, work, full.handler());
    std::stop_source stopped;
    stopped.request_stop();
    bulkhead_test::await([&] { return full.finished(); });
    bulkhead_test::await([&] { return waited.finished(); });
    outcome cancelled;  // stopped before it came
    gate.async_transaction({.stop = stopped.get_token()}, work, cancelled.handler());
    bulkhead_test::await([&] { return cancelled.finished(); });

    CHECK(full.code == reject_reason::admission_full);
    CHECK(waited.code == reject_reason::admission_timeout);
    CHECK(cancelled.code == reject_reason::admission_cancelled);
    const bulkhead_test::recording_observer& heard = gate.observer();
    CHECK(heard.rejected_full == 1);
    CHECK(heard.rejected_timeout == 1);
    CHECK(heard.rejected_cancelled == 1);
    CHECK(heard.rejected_other == 0);
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.rejections(reject_reason::admission_full) == 1);
    CHECK(stats.rejections(reject_reason::admission_timeout) == 1);
    CHECK(stats.rejections(reject_reason::admission_cancelled) == 1);
    busy.go();
    CHECK(gate.available_slots() == 2);
}

namespace {

/// An allocator that counts what it hands out, for [F8].
struct allocation_count {
    std::atomic<int> allocations{0};
    std::atomic<int> deallocations{0};
};

template <class T>
struct counting_allocator {
    using value_type = T;
    allocation_count* count;

    explicit counting_allocator(allocation_count& c) noexcept : count(&c) {}
    template <class U>
    counting_allocator(const counting_allocator<U>& other) noexcept : count(other.count) {}

    T* allocate(std::size_t n) {
        ++count->allocations;
        return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        ++count->deallocations;
        std::allocator<T>().deallocate(p, n);
    }
    template <class U>
    bool operator==(const counting_allocator<U>& other) const noexcept {
        return count == other.count;
    }
};

}  // namespace

TEST_CASE("[F8] the handler's associated executor and allocator are honoured", "[unit][async]") {
    fake_pool pool;
    gate_t gate(pool, 1, 4);
    io_thread io;
    auto strand = asio::make_strand(io.executor());
    allocation_count count;
    std::atomic<bool> in_strand{false};
    std::atomic<bool> done{false};

    SECTION("a completed call") {
        gate.async_transaction(
            {}, [](fake_pool::work&) { return 1; },
            asio::bind_executor(strand,
                                asio::bind_allocator(counting_allocator<void>(count), [&](std::error_code, int) {
                                    in_strand = strand.running_in_this_thread();
                                    done = true;
                                })));
    }
    SECTION("a rejected call") {
        bulkhead_test::blocker<gate_t> busy(gate);
        gate.async_transaction(
            {}, [](fake_pool::work&) { return 1; },
            asio::bind_executor(
                strand, asio::bind_allocator(counting_allocator<void>(count), [&](std::error_code ec, int) {
                    in_strand = strand.running_in_this_thread() && ec == reject_reason::admission_timeout;
                    done = true;
                })));
        bulkhead_test::await([&] { return done.load(); });
    }
    bulkhead_test::await([&] { return done.load(); });
    CHECK(in_strand);
    bulkhead_test::await([&] { return count.deallocations == count.allocations; });
    CHECK(count.allocations >= 1);  // the operation (and the post) came from the handler's allocator
}

TEST_CASE(
    "[F9] the A rules hold for asynchronous callers under random cancellation: slots, FIFO, no lost or "
    "duplicated permit",
    "[unit][async]") {
    fake_pool pool;
    constexpr int concurrent = 3;
    constexpr int extra = 20;
    gate_t gate(pool, concurrent, extra);
    io_thread io_one;
    io_thread io_two;
    std::atomic<int> running{0};
    std::atomic<int> most_running{0};
    std::atomic<int> completions{0};
    std::atomic<int> ran{0};
    std::atomic<int> ok{0};
    std::atomic<int> cancelled_running{0};  // cancelled once the work had started (BEGIN sent): rolled back
    std::atomic<int> duplicated{0};
    constexpr int calls = 3000;
    std::vector<std::unique_ptr<std::atomic<int>>> completed_per_call;
    completed_per_call.reserve(calls);
    for (int i = 0; i < calls; ++i) {
        completed_per_call.push_back(std::make_unique<std::atomic<int>>(0));
    }
    auto work = [&](fake_pool::work&) {
        bulkhead_test::raise_max(most_running, ++running);
        ++ran;
        std::this_thread::yield();
        --running;
        return 1;
    };
    std::vector<std::unique_ptr<asio::cancellation_signal>> signals;
    signals.reserve(calls);
    for (int i = 0; i < calls; ++i) {
        signals.push_back(std::make_unique<asio::cancellation_signal>());
    }
    std::mt19937 random(20261201);
    std::vector<std::thread> blocking;
    blocking.reserve(2);
    std::atomic<int> blocking_ok{0};
    for (int t = 0; t < 2; ++t) {
        blocking.emplace_back([&] {
            for (int i = 0; i < 300; ++i) {
                if (gate.try_transaction(std::chrono::microseconds(200), work)) {
                    ++blocking_ok;
                }
            }
        });
    }
    for (int i = 0; i < calls; ++i) {
        io_thread& io = (i % 2 == 0) ? io_one : io_two;
        const int choice = static_cast<int>(random() % 4);
        auto* signal = signals[static_cast<std::size_t>(i)].get();
        auto* count = completed_per_call[static_cast<std::size_t>(i)].get();
        const auto executor = io.executor();
        asio::post(executor, [&, executor, signal, count, choice] {
            // The handler runs on the event loop that emits the signal: Asio's
            // rule for a cancellation slot (the completion clears it).
            auto handler = asio::bind_executor(executor, [&, count](std::error_code ec, int v) {
                if (count->fetch_add(1) != 0) {
                    ++duplicated;
                }
                if (!ec && v == 1) {
                    ++ok;
                } else if (ec == work_error::work_cancelled) {
                    ++cancelled_running;
                }
                ++completions;
            });
            gate.async_transaction({.queue_wait = choice == 0 ? 0ms : std::chrono::milliseconds(choice)}, work,
                                   asio::bind_cancellation_slot(signal->slot(), std::move(handler)));
        });
        if (choice == 3) {
            asio::post(io.executor(), [signal] { signal->emit(asio::cancellation_type::terminal); });
        }
    }
    for (std::thread& thread : blocking) {
        thread.join();
    }
    bulkhead_test::await([&] { return completions == calls; });
    io_one.stop();
    io_two.stop();
    CHECK(duplicated == 0);
    CHECK(most_running <= concurrent);
    // Every committed call ran its callback once; a call cancelled after
    // BEGIN may end work_cancelled before its callback starts.
    CHECK(ran >= ok + blocking_ok);
    CHECK(ran <= ok + blocking_ok + cancelled_running);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == concurrent + extra);
    CHECK(gate.waiting() == 0);
    CHECK(pool.in_use == 0);
    const bulkhead::gate_stats stats = gate.stats();
    std::uint64_t rejected = 0;
    for (const auto count : stats.rejected) {
        rejected += count;
    }
    CHECK(stats.failed == static_cast<std::uint64_t>(cancelled_running.load()));
    CHECK(stats.completed + stats.failed + rejected == static_cast<std::uint64_t>(calls + 600));
}

TEST_CASE(
    "[G7] an adaptive gate's limit falls and rises under coroutine callers queued for it, and every permit comes "
    "back",
    "[unit][async][G7][adaptive]") {
    fake_pool pool;
    constexpr int ceiling = 6;
    gate_t gate(pool, {.concurrent = ceiling,
                       .extra_slots = 64,
                       .adaptive = bulkhead::adaptive_options{.floor = 1, .interval = 20ms}});
    std::atomic<int> inside{0};
    std::atomic<int> most{0};
    std::atomic<int> cost_ms{1};  // the work's duration: the "database" slows down and recovers
    std::atomic<bool> calling{true};
    std::atomic<int> in_flight{0};
    std::atomic<long> refused{0};
    auto work = [&](fake_pool::work&) {
        bulkhead_test::raise_max(most, inside.fetch_add(1) + 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(cost_ms.load()));  // the work measured, orders nothing
        inside.fetch_sub(1);
        return 1;
    };
    // Twenty callers, each calling again from its completion until told to stop.
    std::function<void()> call = [&] {
        in_flight.fetch_add(1);
        gate.async_transaction({.queue_wait = 200ms}, work, [&](std::error_code code, int) {
            if (code) {
                refused.fetch_add(1);
            }
            if (calling.load()) {
                call();
            }
            in_flight.fetch_sub(1);
        });
    };
    // Every exit from here, a failed REQUIRE included, first stops the
    // callers and waits for their calls: they use the gate and the locals.
    struct stop_calling {
        std::atomic<bool>& calling;
        std::atomic<int>& in_flight;
        ~stop_calling() {
            calling.store(false);
            (void)bulkhead_test::eventually([&] { return in_flight.load() == 0; }, 60s);
        }
    } stopper{calling, in_flight};
    for (int i = 0; i < 20; ++i) {
        call();
    }
    const auto state = [&] {
        const bulkhead::gate_stats now = gate.stats();
        return "limit " + std::to_string(now.limit) + ", reason " + std::string(bulkhead::to_string(now.limit_reason)) +
               ", baseline " + std::to_string(now.latency_baseline.count()) + " ns, changes " +
               std::to_string(now.limit_changes);
    };
    // The slow start takes it up (to at least 5: room to fall); the
    // slowdown brings it below the highest it reached; the recovery raises
    // it again. Twenty-four times slower is past the queue rule 4 allows
    // at a limit of 5 or 6 even with a sanitizer's overhead (the figures
    // are in exercise_fall_and_rise, tests/unit/adaptive_limit_test.cpp).
    int peak = 0;
    const bool climbed = bulkhead_test::eventually(
        [&] {
            peak = std::max(peak, gate.limit());
            return peak >= 5;
        },
        20s);
    INFO("after the slow start: " << state() << ", callbacks running at once at most " << most.load());
    REQUIRE(climbed);
    cost_ms.store(24);
    int lowest = peak;
    const bool fell = bulkhead_test::eventually(
        [&] {
            lowest = std::min(lowest, gate.limit());
            return lowest < peak;
        },
        20s);
    INFO("after the slowdown: " << state());
    REQUIRE(fell);
    cost_ms.store(1);
    const bool rose = bulkhead_test::eventually([&] { return gate.limit() > lowest; }, 20s);
    INFO("after the recovery: " << state());
    REQUIRE(rose);
    calling.store(false);
    REQUIRE(bulkhead_test::eventually([&] { return in_flight.load() == 0; }, 20s));
    const bulkhead::gate_stats stats = gate.stats();
    INFO("lowest limit " << lowest << ", changes " << stats.limit_changes << ", refused " << refused.load());
    bulkhead_test::check_every_permit_back(stats, gate.limit(), most.load(), ceiling, 64);
}

TEST_CASE(
    "[G2] coroutine callers of a gate with workload classes: reservations, priority, class queue wait and cancel as "
    "for threads",
    "[unit][async][G2]") {
    fake_pool pool;
    const bulkhead::workload_plan plan{{
        bulkhead::workload_class{.name = "interactive", .reserved = 1, .queue = 4},
        bulkhead::workload_class{.name = "batch", .queue = 4, .queue_wait = 1s, .priority = 5},
    }};
    gate_t gate(pool, {.concurrent = 2, .workloads = plan});
    const bulkhead::workload_id interactive = gate.workload("interactive");
    const bulkhead::workload_id batch = gate.workload("batch");
    io_thread io;

    // batch holds the one shared permit, from a coroutine.
    held_work batch_work;
    outcome batch_first;
    gate.async_transaction({.queue_wait = 1s, .workload = batch}, batch_work.callback(), batch_first.handler());
    batch_work.entered.wait();

    // A second batch coroutine queues, and gives up after the class's 1 s
    // (it asked for 30 s).
    outcome batch_timed_out;
    gate.async_transaction(
        {.queue_wait = 30s, .workload = batch}, [](fake_pool::work&) { return 1; }, batch_timed_out.handler());
    bulkhead_test::await([&] { return batch_timed_out.finished(); });
    CHECK(batch_timed_out.code == reject_reason::admission_timeout);

    // interactive's reserved permit is there for a coroutine at once.
    held_work interactive_work;
    outcome interactive_first;
    gate.async_transaction({.queue_wait = 0ms, .workload = interactive}, interactive_work.callback(),
                           interactive_first.handler());
    interactive_work.entered.wait();

    // Both permits held. Queue, in this order: a batch coroutine (higher
    // priority), an interactive coroutine, a cancelled interactive one.
    outcome batch_waiting;
    std::atomic<int> order{0};
    std::atomic<int> batch_order{0};
    std::atomic<int> interactive_order{0};
    asio::cancellation_signal cancel;
    outcome cancelled;
    gate.async_transaction(
        {.queue_wait = 30s, .workload = batch}, [&](fake_pool::work&) { return batch_order = ++order; },
        batch_waiting.handler());
    bulkhead_test::await([&] { return gate.waiting() == 1; });
    outcome interactive_waiting;
    gate.async_transaction(
        {.queue_wait = 30s, .workload = interactive}, [&](fake_pool::work&) { return interactive_order = ++order; },
        interactive_waiting.handler());
    bulkhead_test::await([&] { return gate.waiting() == 2; });
    asio::post(io.executor(), [&] {
        gate.async_transaction(
            {.queue_wait = 30s, .workload = interactive}, [](fake_pool::work&) { return 1; },
            asio::bind_cancellation_slot(cancel.slot(), asio::bind_executor(io.executor(), cancelled.handler())));
    });
    bulkhead_test::await([&] { return gate.waiting() == 3; });
    asio::post(io.executor(), [&] { cancel.emit(asio::cancellation_type::terminal); });
    bulkhead_test::await([&] { return cancelled.finished(); });
    CHECK(cancelled.code == reject_reason::admission_cancelled);
    CHECK(gate.waiting() == 2);

    // The interactive permit comes back: it is interactive's reservation,
    // so the interactive coroutine gets it, not the older batch one.
    interactive_work.release.count_down();
    bulkhead_test::await([&] { return interactive_first.finished() && interactive_waiting.finished(); });
    CHECK(!interactive_waiting.code);
    CHECK(interactive_order == 1);
    CHECK(!batch_waiting.finished());
    // The shared permit comes back: batch's waiter gets it.
    batch_work.release.count_down();
    bulkhead_test::await([&] { return batch_first.finished() && batch_waiting.finished(); });
    CHECK(!batch_waiting.code);
    CHECK(batch_order == 2);

    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.running == 0);
    CHECK(stats.queued == 0);
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == (2 + 4) + (2 + 4));
    REQUIRE(stats.workloads.size() == 2);
    CHECK(stats.workloads[0].admitted == 2);
    CHECK(stats.workloads[0].rejections(reject_reason::admission_cancelled) == 1);
    CHECK(stats.workloads[1].admitted == 2);
    CHECK(stats.workloads[1].rejections(reject_reason::admission_timeout) == 1);
}
