// Contract F against a real PostgreSQL: a coroutine's cancellation reaches
// the statement running on the server (F3); with the backend frozen or the
// network silent, cancelling returns at once and the call ends by its
// deadline plus slack, permits back only after cleanup (F3, F4); a
// coroutine's call is the same transaction as a thread's (F9).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "tcp_proxy.hpp"

#if BULKHEAD_HAVE_ASIO
#include "asio_support.hpp"

#endif

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <latch>
#include <optional>
#include <stop_token>
#include <string>

using namespace std::chrono_literals;
using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

#if BULKHEAD_HAVE_ASIO

namespace {

/// What goes silent under a running call.
enum class silence { backend_frozen, network_cut };

/// What ends the call: an Asio cancellation signal emitted on the event loop,
/// a stop of options.stop requested by another thread, or only its deadline.
enum class ending { cancellation_signal, stop_request, deadline };

/// A coroutine's call whose server (SIGSTOP of its backend) or network (the
/// proxy forwards nothing and holds new connections, the cancel's included,
/// unanswered) goes silent once its callback runs; then `how` ends it. What
/// must hold whatever the ending: the cancel or stop returns at once and
/// leaves the call running with its permit; the call ends within the pool's
/// slack of the cancel (E15: the cancel goes unanswered, and the watchdog's
/// cut at the cancel plus the slack is the only thing that can end it), or
/// without a cancel within its deadline plus the slack; when its completion
/// runs the connection is discarded and the permit is back; the next call is
/// served.
void silent_server_call(silence what, ending how) {
    constexpr auto deadline_in = 1000ms;
    constexpr auto slack = 250ms;
    const std::string name = "bulkhead-f3-silent";
    std::optional<tcp_proxy> proxy;
    auto options = pool_options(name, 1);
    if (what == silence::network_cut) {
        const auto [host, port] = server_address();
        proxy.emplace(host, port);
        options = proxied_options(*proxy, name);
    }
    options.deadline_slack = slack;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    io_thread io;
    asio::cancellation_signal signal;
    std::stop_source stop;

    struct seen_at_completion {
        std::promise<void> done;
        clock_type::time_point at;
        std::error_code code;
        int available = -1;
        std::size_t leased = 99;
        std::size_t size = 99;
    } seen;
    std::future<void> completed = seen.done.get_future();
    std::exception_ptr failure;
    int backend = 0;
    std::latch borrowed(1);  // the callback runs; `backend` is set
    std::latch silenced(1);  // the backend is frozen or the network cut
    std::atomic<bool> answered{false};
    std::optional<frozen_backend> frozen;

    const auto start = clock_type::now();
    gate_t::options call{.deadline = start + deadline_in};
    if (how == ending::stop_request) {
        call.stop = stop.get_token();
    }
    asio::post(io.executor(), [&] {
        gate.async_transaction(
            call,
            [&](pqxx::dbtransaction& tx) {
                backend = tx.conn().backendpid();
                borrowed.count_down();
                silenced.wait();
                tx.exec("SELECT 1");  // never answered
                answered = true;
                return 0;
            },
            failure,
            asio::bind_executor(io.executor(),
                                asio::bind_cancellation_slot(signal.slot(), [&](std::error_code ec, int) {
                                    seen.at = clock_type::now();
                                    seen.code = ec;
                                    seen.available = gate.available();
                                    const bulkhead::pool_stats stats = gate.pool().stats();
                                    seen.leased = stats.size - stats.idle;
                                    seen.size = stats.size;
                                    seen.done.set_value();
                                })));
    });
    borrowed.wait();
    if (what == silence::backend_frozen) {
        frozen.emplace(backend);
    } else {
        proxy->silence(true);
        proxy->hold_new(true);
    }
    silenced.count_down();

    // The cancel: it returns at once, and the call keeps its permit.
    struct seen_after_cancel {
        std::chrono::microseconds took{-1};
        bool done = true;
        int available = -1;
    } after;
    clock_type::time_point cancelled_at{};
    const auto look = [&](auto&& cancel) {
        const auto before = clock_type::now();
        cancelled_at = before;
        cancel();
        after.took = std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - before);
        after.done = completed.wait_for(0s) == std::future_status::ready;
        after.available = gate.available();
    };
    if (how == ending::cancellation_signal) {
        // Emitted on the event loop, where the handler's slot lives.
        std::promise<void> emitted;
        asio::post(io.executor(), [&] {
            look([&] { signal.emit(asio::cancellation_type::terminal); });
            emitted.set_value();
        });
        emitted.get_future().wait();
    } else if (how == ending::stop_request) {
        look([&] { stop.request_stop(); });
    }
    const char* const id = how == ending::cancellation_signal ? "F3" : "F4";
    if (how != ending::deadline) {
        std::printf("async: %s %s, %s took %ld us\n", id,
                    what == silence::backend_frozen ? "backend frozen" : "network cut, cancel held",
                    how == ending::cancellation_signal ? "emit(terminal)" : "request_stop()",
                    static_cast<long>(after.took.count()));
        // Microseconds as a rule; the bound leaves room for sanitizers on a
        // loaded machine. Nothing but the watchdog can end the call, at the
        // cancel plus the slack, so it still runs and holds its permit.
        CHECK(after.took < 200ms);
        CHECK_FALSE(after.done);
        CHECK(after.available == 0);
    }

    REQUIRE(completed.wait_for(10s) == std::future_status::ready);
    const auto took = seen.at - start;
    std::printf("async: %s %s, ended by %s, deadline 1000 ms, slack 250 ms: completed %ld ms after the start\n", id,
                what == silence::backend_frozen ? "backend frozen" : "network cut",
                how == ending::deadline ? "the deadline" : "a cancel",
                static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
    if (how == ending::deadline) {
        CHECK(took >= deadline_in);
        CHECK(took < deadline_in + slack + 400ms);
    } else {
        const auto after_cancel = seen.at - cancelled_at;
        CHECK(after_cancel >= slack - 50ms);
        CHECK(after_cancel < slack + 400ms);
    }
    CHECK(seen.code == (how == ending::deadline ? bulkhead::work_error::work_deadline_exceeded
                                                : bulkhead::work_error::work_cancelled));
    CHECK(failure);
    CHECK_FALSE(answered);
    // Cleanup came first: at completion the connection was discarded (it may
    // still have an answer or a cancel on its way) and the permit was back.
    CHECK(seen.available == 1);
    CHECK(seen.leased == 0);
    CHECK(seen.size == 0);
    if (proxy && how != ending::deadline) {
        CHECK(proxy->held() >= 1);  // the cancel really was sent, and is still stuck
    }
    frozen.reset();
    if (proxy) {
        proxy->hold_new(false);
        proxy->silence(false);
    }
    auto next = gate.async_transaction(
        {.queue_wait = 1s}, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 5")[0].as<int>(); },
        asio::use_future);
    CHECK(next.get() == 5);
    CHECK(gate.available() == 1);
}

}  // namespace

TEST_CASE(
    "[F3] cancelling a coroutine while its statement runs cancels it on the server, and the permits stay held "
    "until the rollback and the connection's return",
    "[pg][F3]") {
    const std::string name = "bulkhead-f3";
    bulkhead::pqxx_pool pool(pool_options(name, 2));
    gate_t gate(pool, 1, 1);
    io_thread io;
    pqxx::connection monitor = outside_connection();
    asio::cancellation_signal signal;

    struct seen_at_completion {
        std::atomic<bool> done{false};
        std::error_code code;
        int available = -1;
        std::size_t leased = 99;
    } seen;
    std::exception_ptr failure;
    const auto started = std::chrono::steady_clock::now();
    asio::post(io.executor(), [&] {
        gate.async_transaction(
            {.queue_wait = 1s},
            [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 1 FROM pg_sleep(30)")[0].as<int>(); },
            failure,
            asio::bind_executor(io.executor(),
                                asio::bind_cancellation_slot(signal.slot(), [&](std::error_code ec, int) {
                                    seen.code = ec;
                                    seen.available = gate.available();
                                    const bulkhead::pool_stats stats = gate.pool().stats();
                                    seen.leased = stats.size - stats.idle;
                                    seen.done = true;
                                })));
    });
    // The statement is running on the server: pg_sleep itself, not the BEGIN
    // before it (a cancel during BEGIN ends the call with work_cancelled and
    // nothing nested, before the callback starts; CI's tsan run hit that).
    await([&] { return running(monitor, name, "pg_sleep(30)") == 1; });
    CHECK(gate.available() == 0);
    asio::post(io.executor(), [&] { signal.emit(asio::cancellation_type::terminal); });
    await([&] { return seen.done.load(); });
    CHECK(std::chrono::steady_clock::now() - started < 10s);  // cancelled, not waited out (30 s)
    CHECK(seen.code == bulkhead::work_error::work_cancelled);
    // Released only after cleanup: at completion the permit was back and the
    // connection was in the pool, rolled back (idle, not idle in transaction).
    CHECK(seen.available == 1);
    CHECK(seen.leased == 0);
    CHECK(sessions(monitor, name, "idle in transaction") == 0);
    REQUIRE(failure);
    CHECK(sqlstate_of([&] {
              try {
                  std::rethrow_exception(failure);
              } catch (const bulkhead::work_cancelled& cancelled) {
                  std::rethrow_if_nested(cancelled);
              }
          }) == "57014");  // query_canceled: the server's own word
    // The connection is fine for the next caller.
    auto next = gate.async_transaction(
        {}, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 5")[0].as<int>(); }, asio::use_future);
    CHECK(next.get() == 5);
}

// [direct]: freezes the backend by its pid (SIGSTOP); through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[F3] cancelling a coroutine whose backend is frozen or whose network is cut returns at once, and the call ends "
    "by its deadline plus slack with the permits back only after cleanup",
    "[pg][F3][silent][direct]") {
    SECTION("the backend is frozen mid-transaction (SIGSTOP)") {
        silent_server_call(silence::backend_frozen, ending::cancellation_signal);
    }
    SECTION("the network is cut mid-transaction, and the cancel's own connection is never answered") {
        silent_server_call(silence::network_cut, ending::cancellation_signal);
    }
}

// [direct]: freezes the backend by its pid (SIGSTOP); through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[F4] a coroutine's deadline and stop bound its call as a thread's do when the server or the network goes "
    "silent",
    "[pg][F4][silent][direct]") {
    SECTION("the deadline alone, backend frozen") { silent_server_call(silence::backend_frozen, ending::deadline); }
    SECTION("the deadline alone, network cut") { silent_server_call(silence::network_cut, ending::deadline); }
    SECTION("options.stop requested by another thread, backend frozen") {
        silent_server_call(silence::backend_frozen, ending::stop_request);
    }
    SECTION("options.stop requested by another thread, network cut and the cancel unanswered") {
        silent_server_call(silence::network_cut, ending::stop_request);
    }
}

TEST_CASE("[F9] a coroutine's call and a thread's run the same transaction: committed once, visible to both",
          "[pg][F9]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-f9"));
    gate_t gate(pool, 2, 2);
    scratch_table table("bulkhead_f9", "v int");
    io_thread io;
    auto written = asio::co_spawn(
        io.executor(),
        [&]() -> asio::awaitable<int> {
            co_return co_await gate.async_transaction(
                {},
                [&](pqxx::dbtransaction& tx) {
                    exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (41)");
                    return exec_one_row(tx, "SELECT count(*) FROM " + table.name())[0].as<int>();
                },
                asio::use_awaitable);
        },
        asio::use_future);
    CHECK(written.get() == 1);
    CHECK(gate.transaction(0ms, [&](pqxx::dbtransaction& tx) {
        return exec_one_row(tx, "SELECT sum(v) FROM " + table.name())[0].as<int>();
    }) == 41);
}

TEST_CASE("[J1] a coroutine's callback that takes bulkhead::pqxx_transaction& sends BEGIN with its first statement",
          "[pg][J1][F9]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-j1-async"));
    gate_t gate(pool, 2, 2);
    scratch_table table("bulkhead_j1_async", "v int");
    io_thread io;
    const auto write = [&](bulkhead::pqxx_transaction& tx) {
        const bool begun_before = tx.begun();
        (void)tx.exec("INSERT INTO " + table.name() + " VALUES (41)");
        return !begun_before && tx.begun();
    };
    auto written = asio::co_spawn(
        io.executor(),
        [&]() -> asio::awaitable<bool> { co_return co_await gate.async_transaction({}, write, asio::use_awaitable); },
        asio::use_future);
    CHECK(written.get());
    CHECK(table.rows("v = 41") == 1);
}

#else

TEST_CASE("[F3] cancelling a coroutine while its statement runs cancels it on the server", "[pg][F3]") {
    FAIL("the [F3] test needs standalone Asio (apt-get install libasio-dev, then reconfigure)");
}

#endif
