// Contract K against a real PostgreSQL: the pool's housekeeping thread pings
// idle connections (K1), keeps min_idle connections open (K2) and reports
// leases held past leak_threshold (K4); the pool's options from text (K7).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"
#include "test_util.hpp"

#include "catch.hpp"

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

TEST_CASE("[K7] a pool's options read from text or the environment, the conninfo never quoted", "[pg][K7]") {
    SECTION("every key, over a base") {
        const bulkhead::pqxx_pool_options read = bulkhead::parse_pool_settings(
            "conninfo='host=db password=it''s' max_size=24 min_idle=4  # sizes\n"
            "connection_timeout=500ms validation_timeout=1s idle_timeout=10min max_lifetime=0ms keepalive_time=60s\n"
            "validate_after_idle=0ms deadline_slack=100ms application_name='orders api'; reset_session=false\n"
            "connection_affinity=false budget_check=warn");
        CHECK(read.conninfo == "host=db password=it's");
        CHECK(read.max_size == 24);
        CHECK(read.min_idle == 4);
        CHECK(read.connection_timeout == 500ms);
        CHECK(read.validation_timeout == 1s);
        CHECK(read.idle_timeout == 10min);
        CHECK(read.max_lifetime == 0ms);
        CHECK(read.keepalive_time == 60s);
        CHECK(read.validate_after_idle == 0ms);
        CHECK(read.deadline_slack == 100ms);
        CHECK(read.application_name == "orders api");
        CHECK_FALSE(read.reset_session);
        CHECK_FALSE(read.connection_affinity);
        CHECK(read.budget_check == bulkhead::budget_check_mode::warn);
        bulkhead::pqxx_pool_options base;
        base.conninfo = "host=elsewhere";
        base.max_size = 3;
        const bulkhead::pqxx_pool_options over = bulkhead::parse_pool_settings("min_idle=1", base);
        CHECK(over.conninfo == "host=elsewhere");
        CHECK(over.max_size == 3);
        CHECK(over.min_idle == 1);
    }
    SECTION("errors name the key, never a password") {
        const auto refused = [](const char* text) {
            return message_of<std::invalid_argument>([&] { (void)bulkhead::parse_pool_settings(text); });
        };
        for (const char* text : {"conninfo='host=db password=hunter2xyz", "conninfo=host=db password=hunter2xyz",
                                 "conninfo=host=db'password=hunter2xyz'", "conninfo='host=db password=hunter2xyz'x"}) {
            const std::string message = refused(text);
            INFO(text << " -> " << message);
            CHECK(message.starts_with("bulkhead pool settings: line 1: "));
            CHECK(message.find("hunter2") == std::string::npos);
            CHECK(message.find("unter") == std::string::npos);
        }
        CHECK(refused("reset_session=yes") ==
              "bulkhead pool settings: line 1: reset_session \"yes\" is not true or false");
        CHECK(refused("budget_check=maybe") ==
              "bulkhead pool settings: line 1: budget_check \"maybe\" is not off, warn or refuse");
        CHECK(
            refused("max_size=8\nconnection_timeout=500") ==
            "bulkhead pool settings: line 2: connection_timeout \"500\" has no unit: add one of ns, us, ms, s or min, "
            "as in 50ms");
        CHECK(refused("pool_size=8").starts_with("bulkhead pool settings: line 1: unknown key \"pool_size\" (known: "));
    }
    SECTION("from the environment, and out of range as the pool refuses it from code") {
        const bulkhead::pqxx_pool_options base = pool_options("bulkhead-k7", 1);
        CHECK(bulkhead::pool_settings_from_env("BULKHEAD_POOL_K7_UNSET", base).max_size == 1);
        const scoped_env variable("BULKHEAD_POOL_K7_TEST", "max_size=2 min_idle=1");
        const bulkhead::pqxx_pool_options read = bulkhead::pool_settings_from_env("BULKHEAD_POOL_K7_TEST", base);
        bulkhead::pqxx_pool pool(read);
        CHECK(pool.size() == 1);  // min_idle from the text, against the real server
        CHECK(pool.options().max_size == 2);
        CHECK_THROWS_WITH(bulkhead::pqxx_pool(bulkhead::parse_pool_settings("max_size=0", base)),
                          Catch::Matchers::ContainsSubstring("max_size must be in [1, "));
    }
}

namespace {

/// The leak reports a pool made, taken from its housekeeping thread.
struct leak_log {
    std::mutex mutex;
    std::vector<bulkhead::lease_leak> reports;

    void add(const bulkhead::lease_leak& leak) {
        const std::lock_guard lock(mutex);
        reports.push_back(leak);
    }
    std::vector<bulkhead::lease_leak> seen() {
        const std::lock_guard lock(mutex);
        return reports;
    }
};

}  // namespace

TEST_CASE("[K4] a lease held past leak_threshold is reported once, with how long and where it was taken", "[pg][K4]") {
    constexpr auto threshold = 200ms;
    leak_log log;
    auto options = pool_options("bulkhead-k4", 2);
    options.leak_threshold = threshold;
    options.on_leak = [&log](const bulkhead::lease_leak& leak) { log.add(leak); };
    bulkhead::pqxx_pool pool(options);
    using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
    gate_t gate(pool, 2, 0);

    SECTION("a lease: the line of its acquire(), reported once however long it is held") {
        const int line = __LINE__ + 1;
        bulkhead::pqxx_pool::lease held = pool.acquire();
        const int backend = held.connection().backendpid();
        await([&] { return !log.seen().empty(); });
        // Held for a further ten housekeeping periods: no second report.
        std::this_thread::sleep_for(threshold * 10 / 4);
        const std::vector<bulkhead::lease_leak> reports = log.seen();
        REQUIRE(reports.size() == 1);
        CHECK(reports[0].held >= threshold);
        CHECK(reports[0].held < threshold + 2s);
        CHECK(reports[0].backend_pid == backend);
        INFO("where: " << reports[0].where);
        CHECK(reports[0].where.find("upkeep_pg_test.cpp:" + std::to_string(line)) != std::string::npos);
    }
    SECTION("a label given to acquire(), and a lease returned in time is never reported") {
        { bulkhead::pqxx_pool::lease brief = pool.acquire(); }
        bulkhead::pqxx_pool::lease held = pool.acquire(std::chrono::steady_clock::time_point::max(), "batch import");
        await([&] { return !log.seen().empty(); });
        std::this_thread::sleep_for(threshold * 10 / 4);
        const std::vector<bulkhead::lease_leak> reports = log.seen();
        REQUIRE(reports.size() == 1);
        CHECK(reports[0].where == "batch import");
    }
    SECTION("a gate's call: the line of its options, or their label") {
        const auto hold = [&](pqxx::dbtransaction&) {
            await([&] { return !log.seen().empty(); });
            return 0;
        };
        const int line = __LINE__ + 1;
        (void)gate.transaction({.queue_wait = 1s}, hold);
        (void)gate.transaction({.queue_wait = 1s, .site = "nightly rollup"}, [&](pqxx::dbtransaction&) {
            await([&] { return log.seen().size() == 2; });
            return 0;
        });
        const std::vector<bulkhead::lease_leak> reports = log.seen();
        REQUIRE(reports.size() == 2);
        INFO("where: " << reports[0].where);
        CHECK(reports[0].where.find("upkeep_pg_test.cpp:" + std::to_string(line)) != std::string::npos);
        CHECK(reports[1].where == "nightly rollup");
    }
}
