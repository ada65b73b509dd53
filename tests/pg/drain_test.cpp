// Contract K5 against a real PostgreSQL: close(deadline) on the gate and on
// the pool. New calls are refused with `closed`; calls already inside,
// queued and running, threads and coroutines, may finish until the
// deadline; what is left then is stopped as a caller's stop would stop it
// (a queued call refused with `closed`, a running statement cancelled on
// the server); a call stuck on a frozen backend is reported still running
// and close() returns on time; destroying a gate or a pool with work inside
// ends the process with a message. Contract K6: the gate's health, with what
// its pool knows (it cannot connect; the fleet's budget).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "run_program.hpp"
#include "tcp_proxy.hpp"
#include "test_util.hpp"

#if BULKHEAD_HAVE_ASIO
#include "asio_support.hpp"
#endif

#include "catch.hpp"

#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <future>
#include <latch>
#include <optional>
#include <regex>
#include <stop_token>
#include <string>
#include <system_error>

#ifndef BULKHEAD_DRAIN_PROBE_PATH
#define BULKHEAD_DRAIN_PROBE_PATH ""
#endif

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;
using bulkhead::reject_reason;

namespace {

/// How a process ended by std::terminate() looks through popen's shell: the
/// signal itself, or the shell's exit status for it.
bool aborted(int status) {
    return (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) ||
           (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGABRT);
}

/// A blocking call of `gate` that runs `sql` and returns its first value.
std::future<int> call_in_thread(gate_t& gate, std::string sql, std::stop_token stop = {}) {
    return std::async(std::launch::async, [&gate, sql = std::move(sql), stop] {
        return gate.transaction({.queue_wait = 60s, .stop = stop},
                                [&](pqxx::dbtransaction& tx) { return exec_one_row(tx, sql)[0].as<int>(); });
    });
}

}  // namespace

TEST_CASE("[K5] close() refuses new calls with closed and lets the calls inside finish before its deadline",
          "[pg][drain]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-k5-finish", 2));
    gate_t gate(pool, 1, 2);
    std::latch running(1);
    std::latch finish(1);
    auto first = std::async(std::launch::async, [&] {
        return gate.transaction({.queue_wait = 10s}, [&](pqxx::dbtransaction& tx) {
            running.count_down();
            finish.wait();
            return exec_one_row(tx, "SELECT 1")[0].as<int>();
        });
    });
    running.wait();
    auto second = call_in_thread(gate, "SELECT 2");
    await([&] { return gate.waiting() == 1; });
    CHECK(gate.in_flight() == 2);

    auto closing = std::async(std::launch::async, [&] { return gate.close(clock_type::now() + 60s); });
    await([&] { return gate.closed(); });
    const auto refused = gate.try_transaction(10s, [](pqxx::dbtransaction&) { return 0; });
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == reject_reason::closed);
    CHECK_THROWS_AS(gate.transaction(10s, [](pqxx::dbtransaction&) { return 0; }), bulkhead::closed);
    CHECK(message_of<bulkhead::closed>([&] { (void)gate.enter(); }) == "db gate closed");
    // The call inside holds it open: close() waits for it.
    CHECK(closing.wait_for(0s) == std::future_status::timeout);

    finish.count_down();
    CHECK(first.get() == 1);
    CHECK(second.get() == 2);  // admitted before close(): it runs
    const bulkhead::close_report report = closing.get();
    CHECK(report.in_flight == 2);
    CHECK(report.cancelled == 0);
    CHECK(report.finished() == 2);
    CHECK(report.still_running == 0);
    CHECK(report.drained());
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.rejections(reject_reason::closed) == 3);
    CHECK(stats.completed == 2);
    CHECK(gate.in_flight() == 0);
}

TEST_CASE(
    "[K5] at its deadline close() stops the calls left: queued ones are refused with closed, a running "
    "statement is cancelled on the server",
    "[pg][drain][direct]") {
    const std::string name = "bulkhead-k5-cancel";
    bulkhead::pqxx_pool pool(pool_options(name, 2));
    gate_t gate(pool, 1, 4);
    pqxx::connection monitor = outside_connection();
    auto sleeper = call_in_thread(gate, "SELECT 1 FROM pg_sleep(60)");
    await([&] { return running(monitor, name, "pg_sleep") == 1; });
    auto queued = call_in_thread(gate, "SELECT 2");
    std::stop_source own;  // a caller with a stop token of its own: joined with the gate's
    auto queued_with_token = call_in_thread(gate, "SELECT 3", own.get_token());
    int awaited = 2;
#if BULKHEAD_HAVE_ASIO
    io_thread io;
    auto coroutine = gate.async_transaction(
        {.queue_wait = 60s}, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 4")[0].as<int>(); },
        asio::use_future);
    awaited = 3;
#endif
    await([&] { return gate.waiting() == awaited; });

    const auto start = clock_type::now();
    const bulkhead::close_report report = gate.close(start + 300ms);
    const auto took = clock_type::now() - start;
    CHECK(took >= 300ms);
    CHECK(took < 300ms + 5s);  // the cancel's round trip and the rollback; slack for sanitizers
    CHECK(report.in_flight == awaited + 1);
    CHECK(report.cancelled == awaited + 1);
    CHECK(report.finished() == 0);
    CHECK(report.still_running == 0);
    CHECK(report.drained());

    CHECK_THROWS_AS(sleeper.get(), bulkhead::work_cancelled);
    CHECK_THROWS_AS(queued.get(), bulkhead::closed);
    CHECK_THROWS_AS(queued_with_token.get(), bulkhead::closed);
#if BULKHEAD_HAVE_ASIO
    try {
        (void)coroutine.get();
        FAIL("the coroutine's call was served");
    } catch (const std::system_error& error) {
        CHECK(error.code() == reject_reason::closed);
    }
#endif
    CHECK(running(monitor, name, "pg_sleep") == 0);  // cancelled on the server, not left running
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.rejections(reject_reason::closed) == static_cast<std::uint64_t>(awaited));
    CHECK(stats.work_cancelled == 1);
    CHECK(gate.pool().stats().in_use == 0);
}

TEST_CASE(
    "[K5] a call stuck on a frozen backend: close() returns by its deadline plus cancel_wait and reports it "
    "still running",
    "[pg][drain][direct]") {
    auto options = pool_options("bulkhead-k5-frozen", 1);
    // Longer than close()'s cancel_wait below: the stop's cut (E15) would
    // otherwise end the call within it.
    options.deadline_slack = 3s;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    std::latch borrowed(1);
    std::latch silenced(1);
    int backend = 0;
    auto stuck = std::async(std::launch::async, [&] {
        return gate.transaction({.queue_wait = 1s}, [&](pqxx::dbtransaction& tx) {
            backend = tx.conn().backendpid();
            borrowed.count_down();
            silenced.wait();
            return exec_one_row(tx, "SELECT 1")[0].as<int>();  // unanswered until the backend thaws
        });
    });
    borrowed.wait();
    std::optional<frozen_backend> frozen;
    frozen.emplace(backend);
    silenced.count_down();

    const auto start = clock_type::now();
    const bulkhead::close_report first = gate.close(start + 200ms, 300ms);
    const auto took = clock_type::now() - start;
    CHECK(took >= 500ms);
    CHECK(took < 500ms + 2s);
    CHECK(first.in_flight == 1);
    CHECK(first.cancelled == 1);
    CHECK(first.still_running == 1);
    CHECK_FALSE(first.drained());
    CHECK(stuck.wait_for(0s) == std::future_status::timeout);

    frozen.reset();  // the cancel waiting at the backend now lands
    CHECK_THROWS_AS(stuck.get(), bulkhead::work_cancelled);
    const bulkhead::close_report again = gate.close(clock_type::now() + 10s);
    CHECK(again.in_flight == 0);
    CHECK(again.drained());
}

TEST_CASE("[K5] pqxx_pool::close() refuses acquire with closed, the waiting threads too, and waits for the leases",
          "[pg][drain]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-k5-pool", 1));
    std::optional<bulkhead::pqxx_pool::lease> held;
    held.emplace(pool.acquire());
    auto waiter = std::async(std::launch::async, [&] { return pool.acquire(clock_type::now() + 60s); });
    await([&] { return pool.stats().waiting == 1; });

    auto closing = std::async(std::launch::async, [&] { return pool.close(clock_type::now() + 60s); });
    CHECK_THROWS_AS(waiter.get(), bulkhead::closed);
    CHECK(closing.wait_for(0s) == std::future_status::timeout);  // the lease is still out
    CHECK_THROWS_AS(pool.acquire(), bulkhead::closed);
    held.reset();
    const bulkhead::close_report report = closing.get();
    CHECK(report.in_flight == 2);  // the lease and the waiter
    CHECK(report.still_running == 0);
    CHECK(report.drained());
    const bulkhead::pool_stats stats = pool.stats();
    CHECK(stats.size == 0);
    CHECK(stats.closed_for(bulkhead::close_reason::shutdown) == 1);
}

TEST_CASE("[K5] destroying a gate or a pool with work inside ends the process with a message", "[pg][drain]") {
    const std::string probe = BULKHEAD_DRAIN_PROBE_PATH;
    REQUIRE_FALSE(probe.empty());
    const auto quoted = "'" + conninfo() + "'";
    SECTION("a gate with a permit held") {
        const program_result run = run_program(probe, "gate " + quoted + " 2>&1");
        CHECK(run.output.find("bulkhead::db_bulkhead destroyed with 1 call(s) still inside") != std::string::npos);
        CHECK(run.output.find("survived") == std::string::npos);
        CHECK(aborted(run.status));
    }
    SECTION("a pool with a thread waiting in acquire()") {
        const program_result run = run_program(probe, "pool " + quoted + " 2>&1");
        CHECK(run.output.find("bulkhead::pqxx_pool (threads waiting in acquire()) destroyed with 1 call(s)") !=
              std::string::npos);
        CHECK(run.output.find("survived") == std::string::npos);
        CHECK(aborted(run.status));
    }
}

TEST_CASE(
    "[K6] health: a pool that cannot connect is not serving, with its last error and no password, and it serves "
    "again once it connects",
    "[pg][health][direct]") {
    tcp_proxy proxy = proxy_to_server();
    auto options = proxied_options(proxy, "bulkhead-k6-connect");
    // The suite's conninfo carries the server's password: it must not show.
    std::smatch password;
    REQUIRE(std::regex_search(options.conninfo, password, std::regex(R"(password=([^ ]+))")));
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    CHECK(gate.health().serving);  // nothing tried yet: nothing known against it

    proxy.refuse_new(true);
    // Bounded by a deadline, not by a shorter connection_timeout: the call
    // after the outage must outwait the back-off its failed attempts grew
    // (up to 1 s) within the pool's 2 s.
    CHECK_THROWS_AS(gate.transaction({.queue_wait = 1s, .deadline = clock_type::now() + 300ms},
                                     [](pqxx::dbtransaction&) { return 0; }),
                    bulkhead::rejected);
    bulkhead::gate_health health = gate.health();
    CHECK_FALSE(health.serving);
    CHECK(health.reason == bulkhead::health_reason::cannot_connect);
    INFO("detail: " << health.detail);
    CHECK_FALSE(health.detail.empty());
    CHECK(health.detail.find(password[1].str()) == std::string::npos);
    CHECK_FALSE(pool.health().can_connect);

    proxy.refuse_new(false);
    CHECK(gate.transaction(5s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 1")[0].as<int>(); }) == 1);
    health = gate.health();
    CHECK(health.serving);
    CHECK(health.reason == bulkhead::health_reason::none);
}

TEST_CASE("[K6] health: a fleet over the server's connection budget serves, with the budget as the warning",
          "[pg][health][direct]") {
    auto options = pool_options("bulkhead-k6-budget", 2);
    options.budget_check = bulkhead::budget_check_mode::warn;
    options.fleet = {.instances = 100000, .application_prefix = "bulkhead-k6-budget"};
    int warnings = 0;
    options.on_budget_warning = [&](const bulkhead::budget_warning&) { ++warnings; };
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    CHECK(warnings == 1);
    const bulkhead::gate_health health = gate.health();
    CHECK(health.serving);
    CHECK(health.reason == bulkhead::health_reason::budget_exceeded);
    CHECK(health.detail.find("does not fit") != std::string::npos);
    // read_budget() reads it again, and health() says what it read.
    CHECK_FALSE(pool.read_budget().fits());
    CHECK(gate.health().reason == bulkhead::health_reason::budget_exceeded);
}
