// Contract K against a real PostgreSQL: the pool's housekeeping thread pings
// idle connections (K1) and keeps min_idle connections open (K2).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"
#include "test_util.hpp"

#include "catch.hpp"

#include <chrono>
#include <string>

using namespace bulkhead_test;

namespace {

/// What pg_stat_activity shows of backend `pid`: its last query, and when
/// its state last changed (microseconds since the epoch, as text sorts).
struct backend_view {
    std::string query;
    long long state_change_us = 0;
};

backend_view view_of(pqxx::connection& monitor, int pid) {
    pqxx::nontransaction tx(monitor);
    const pqxx::row row = exec_one_row(tx,
                                       "SELECT query, (extract(epoch FROM state_change) * 1000000)::bigint FROM "
                                       "pg_stat_activity WHERE pid = " +
                                           std::to_string(pid));
    return {row[0].as<std::string>(), row[1].as<long long>()};
}

}  // namespace

// [direct]: watches the backends by pid; through PgBouncer the client's pid is one PgBouncer made up.
TEST_CASE("[K1] idle connections are pinged every keepalive_time, never one in use", "[pg][K1][direct]") {
    auto options = pool_options("bulkhead-k1", 2);
    options.keepalive_time = 200ms;
    options.validate_after_idle = 1h;  // only the housekeeping thread asks anything of an idle connection
    bulkhead::pqxx_pool pool(options);
    auto monitor = outside_connection();
    bulkhead::pqxx_pool::lease held = pool.acquire();
    int idle_pid = 0;
    {
        bulkhead::pqxx_pool::lease idle = pool.acquire();
        idle_pid = idle->backendpid();
    }
    const int held_pid = held->backendpid();
    {
        pqxx::nontransaction tx(held.connection());
        (void)exec_one_row(tx, "SELECT 'held by the test'");
    }
    const backend_view held_before = view_of(monitor, held_pid);
    // Two pings of the idle connection, one after the other.
    backend_view last = view_of(monitor, idle_pid);
    for (int ping = 0; ping < 2; ++ping) {
        const long long before = last.state_change_us;
        await([&] {
            last = view_of(monitor, idle_pid);
            return last.state_change_us > before;
        });
        CHECK_THAT(last.query, Catch::Matchers::ContainsSubstring("transaction_timestamp() = statement_timestamp()"));
    }
    // Meanwhile the connection in use was left alone.
    const backend_view held_after = view_of(monitor, held_pid);
    CHECK(held_after.query == held_before.query);
    CHECK(held_after.state_change_us == held_before.state_change_us);
    CHECK(pool.stats().opened == 2);  // the pings kept the connection, nothing was replaced
    CHECK(pool.idle() == 1);
}

TEST_CASE("[K2] min_idle connections are kept open after closes and failures", "[pg][K2][direct]") {
    tcp_proxy proxy = proxy_to_server();
    auto options = proxied_options(proxy, "bulkhead-k2");
    options.max_size = 3;
    options.min_idle = 2;
    bulkhead::pqxx_pool pool(options);
    auto monitor = outside_connection();
    CHECK(pool.idle() == 2);  // opened by the constructor
    // The server closes both; new connections are refused for a while.
    proxy.refuse_new(true);
    {
        pqxx::nontransaction tx(monitor);
        tx.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'bulkhead-k2'" +
                std::string(not_the_monitor));
    }
    // Found without a borrow, from the farewell the server sent each; the
    // refills fail while the proxy refuses.
    await([&] {
        const bulkhead::pool_stats stats = pool.stats();
        return stats.closed_for(bulkhead::close_reason::validation_failed) +
                       stats.closed_for(bulkhead::close_reason::broken) ==
                   2 &&
               stats.connect_failures >= 1;
    });
    CHECK(pool.idle() == 0);
    proxy.refuse_new(false);
    await([&] { return pool.idle() == 2; });  // refilled once the back-off allows
    CHECK(pool.stats().opened == 4);
    CHECK(pool.size() == 2);
    CHECK(sessions(monitor, "bulkhead-k2") == 2);
}
