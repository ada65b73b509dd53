// Observability against a real server: pool counters move exactly when their
// event happens, the close hook hears every close, sessions carry the pool's
// application_name, and a live exposition passes the format check.
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include <bulkhead/prometheus.hpp>

#include "catch.hpp"

#include <algorithm>
#include <latch>
#include <mutex>
#include <vector>

using namespace bulkhead_test;
using bulkhead::close_reason;

namespace {

struct close_log {
    std::mutex mutex;
    std::vector<close_reason> reasons;
    std::function<void(close_reason)> hook() {
        return [this](close_reason reason) {
            const std::lock_guard lock(mutex);
            reasons.push_back(reason);
        };
    }
    std::size_t count(close_reason reason) {
        const std::lock_guard lock(mutex);
        return static_cast<std::size_t>(std::count(reasons.begin(), reasons.end(), reason));
    }
};

}  // namespace

// [direct]: terminates a pool connection's backend by its pid; through PgBouncer there is no backend of the
// pool's own to kill; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("pool stats, opened, and closed for each reason, with the hook told", "[pg][stats][direct]") {
    close_log log;
    auto options = pool_options("bulkhead-stats-close", 2);
    options.validate_after_idle = 0ms;
    options.on_close = log.hook();
    auto monitor = outside_connection();
    {
        bulkhead::pqxx_pool pool(options);
        bulkhead::db_bulkhead gate(pool, 1, 0);
        CHECK(pool.stats().opened == 0);
        const int pid = gate.transaction(
            1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(); });
        CHECK(pool.stats().opened == 1);

        // killed while idle, found out on borrow: broken (the server said it
        // was closing the connection) or validation_failed (the check)
        terminate_backend(monitor, pid);
        gate.transaction(1s, [](pqxx::dbtransaction&) {});
        CHECK(pool.stats().closed_for(close_reason::broken) +
                  pool.stats().closed_for(close_reason::validation_failed) ==
              1);
        CHECK(pool.stats().opened == 2);

        // discarded
        {
            auto lease = pool.acquire();
            pool.discard(lease);
        }
        CHECK(pool.stats().closed_for(close_reason::discarded) == 1);

        // broken: killed while leased
        {
            auto lease = pool.acquire();
            terminate_backend(monitor, lease->backendpid());
            try {
                pqxx::nontransaction tx(lease.connection());
                tx.exec("SELECT 1");
            } catch (const pqxx::broken_connection&) {
            }
        }
        CHECK(pool.stats().closed_for(close_reason::broken) +
                  pool.stats().closed_for(close_reason::validation_failed) ==
              2);

        // acquire timeouts
        {
            auto first = pool.acquire();
            auto second = pool.acquire();
            CHECK_THROWS_AS(pool.acquire(std::chrono::steady_clock::now() + 10ms), bulkhead::pool_timeout);
        }
        CHECK(pool.stats().acquire_timeouts == 1);
        CHECK(pool.stats().idle == 2);
    }
    // shutdown: the two idle connections
    CHECK(log.count(close_reason::shutdown) == 2);
    CHECK(log.count(close_reason::discarded) == 1);
    CHECK(log.reasons.size() == 5);
}

TEST_CASE("pool stats, lifetime and idle retirement, and connection failures, are counted", "[pg][stats]") {
    SECTION("lifetime") {
        auto options = pool_options("bulkhead-stats-lifetime", 1);
        options.max_lifetime = 250ms;
        bulkhead::pqxx_pool pool(options);
        { auto lease = pool.acquire(); }
        std::this_thread::sleep_for(300ms);  // age the connection: the condition under test
        { auto lease = pool.acquire(); }
        CHECK(pool.stats().closed_for(close_reason::lifetime) == 1);
    }
    SECTION("idle") {
        auto options = pool_options("bulkhead-stats-idle", 2);
        options.idle_timeout = 250ms;
        bulkhead::pqxx_pool pool(options);
        {
            auto a = pool.acquire();
            auto b = pool.acquire();
        }
        std::this_thread::sleep_for(300ms);
        { auto lease = pool.acquire(); }
        CHECK(pool.stats().closed_for(close_reason::idle) >= 1);
    }
    SECTION("connection failures") {
        bulkhead::pqxx_pool pool(
            {.conninfo = "host=127.0.0.1 port=1 dbname=x user=x password=secret-pw connect_timeout=2",
             .max_size = 1,
             .connection_timeout = 300ms});
        CHECK_THROWS_AS(pool.acquire(), bulkhead::pool_timeout);
        CHECK(pool.stats().connect_failures >= 1);
        CHECK(pool.stats().acquire_timeouts == 1);
        CHECK(pool.stats().opened == 0);
    }
}

TEST_CASE("every session of a pool carries its application_name, so the server can attribute it to the gate",
          "[pg][stats]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-orders-gate", 3));
    bulkhead::db_bulkhead gate(pool, 3, 0);
    auto monitor = outside_connection();
    std::latch inside(3);
    std::latch release(1);
    std::vector<std::thread> workers;
    workers.reserve(3);
    for (int i = 0; i < 3; ++i) {
        workers.emplace_back([&] {
            gate.transaction(1s, [&](pqxx::dbtransaction&) {
                inside.count_down();
                release.wait();
            });
        });
    }
    inside.wait();
    CHECK(sessions(monitor, "bulkhead-orders-gate") == 3);
    release.count_down();
    for (auto& worker : workers) {
        worker.join();
    }
}

TEST_CASE("a live gate and pool render an exposition that passes the format check", "[pg][stats][prometheus]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-stats-live", 2));
    bulkhead::db_bulkhead gate(pool, 2, 2);
    for (int i = 0; i < 20; ++i) {
        gate.transaction(1s, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.001)"); });
    }
    const auto stats = gate.stats();
    CHECK(stats.completed == 20);
    CHECK(stats.work.count() == 20);
    CHECK(stats.work.quantile(0.5) >= 1e6 * (1 - bulkhead::log_linear_histogram::relative_error));
    bulkhead::prometheus_exposition metrics;
    metrics.add("live", stats);
    metrics.add("live", pool.stats());
    const std::string text = metrics.render();
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_completed_total{gate=\"live\"} 20\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_pool_opened_total{pool=\"live\"} "));
    CHECK(text.find("password") == std::string::npos);
}
