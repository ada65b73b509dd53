// Contract F against a real PostgreSQL: a coroutine's cancellation reaches
// the statement running on the server (F3), and a coroutine's call is the
// same transaction as a thread's.
#include "pg_helpers.hpp"

#if BULKHEAD_HAVE_ASIO
#include "asio_support.hpp"

#include <bulkhead/asio.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/use_future.hpp>
#endif

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <string>

using namespace std::chrono_literals;
using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

#if BULKHEAD_HAVE_ASIO

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
    // The statement is running on the server.
    await([&] { return sessions(monitor, name, "active") == 1; });
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

#else

TEST_CASE("[F3] cancelling a coroutine while its statement runs cancels it on the server", "[pg][F3]") {
    FAIL("the [F3] test needs standalone Asio (apt-get install libasio-dev, then reconfigure)");
}

#endif
