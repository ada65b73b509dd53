// Contract G3 and G4 against a real PostgreSQL: an adaptive gate's limit
// falls within 2 s of the database slowing down and rises back within 5 s
// of its recovery. The slowdown is the server's own: another session holds
// an ACCESS EXCLUSIVE lock on the table every call reads, so calls wait
// inside the database (the stall and latency rules), or, with a
// lock_timeout, fail with 55P03 (the error rule). Each call also waits 2 ms
// in the server (pg_sleep), as a statement waiting for I/O does: on this
// project's 2-core machines a purely CPU-bound statement saturates the
// server (and the callers) at one call at a time, and the limit, rightly,
// stays at the floor, leaving nothing to fall from. Twelve callers offer more
// work than the gate's eight permits, retrying a refusal after 2 ms, as a
// busy service would. Each case prints one "adaptive: ..." line with its
// figures (.ci/run collects them).
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include <bulkhead/adaptive_limit.hpp>

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace bulkhead_test;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int adaptive_permits = 8;

/// The callers: each runs the statement in a loop until stopped.
class offered_load {
public:
    offered_load(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate, std::string statement) {
        for (int i = 0; i < 12; ++i) {
            m_callers.emplace_back([this, &gate, statement] {
                while (!m_stop.load()) {
                    try {
                        const auto done = gate.try_transaction(
                            {.queue_wait = 50ms}, [&](pqxx::dbtransaction& tx) { (void)tx.exec(statement); });
                        if (!done) {
                            // Pacing a refused caller, as a client's back-off: orders nothing.
                            std::this_thread::sleep_for(2ms);
                        }
                    } catch (const pqxx::failure&) {  // sql_error, and 53300's too_many_connections
                        m_failed.fetch_add(1);
                    }
                }
            });
        }
    }
    offered_load(const offered_load&) = delete;
    offered_load& operator=(const offered_load&) = delete;
    ~offered_load() { stop(); }

    void stop() {
        m_stop.store(true);
        for (std::thread& caller : m_callers) {
            if (caller.joinable()) {
                caller.join();
            }
        }
    }
    [[nodiscard]] long failed() const { return m_failed.load(); }

private:
    std::atomic<bool> m_stop{false};
    std::atomic<long> m_failed{0};
    std::vector<std::thread> m_callers;
};

/// How long until `done(gate.limit())` holds, looking every millisecond, at
/// most `most` (then most + 1 ms).
template <class Done>
std::chrono::milliseconds until(const bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate, std::chrono::milliseconds most,
                                Done done) {
    const auto start = clock_type::now();
    while (clock_type::now() - start <= most) {
        if (done(gate.limit())) {
            return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
        }
        std::this_thread::sleep_for(1ms);  // polling an observation, not ordering threads
    }
    return most + 1ms;
}

void prepare_table(pqxx::connection& monitor) {
    pqxx::work tx(monitor);
    tx.exec("CREATE TABLE IF NOT EXISTS bulkhead_adaptive (id int PRIMARY KEY)");
    tx.exec("INSERT INTO bulkhead_adaptive VALUES (1) ON CONFLICT DO NOTHING");
    tx.commit();
}

/// Runs the load until the limit has grown past the floor and the gate
/// knows its baseline; returns the limit then.
int settled_limit(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate) {
    REQUIRE(until(gate, 10s, [&](int) { return gate.stats().latency_baseline > 0ns; }) <= 10s);
    // Three seconds of quiet: the slow start ends where the server stops keeping up, or at B.
    std::this_thread::sleep_for(3s);  // the phase's length is the experiment, it orders nothing
    return gate.limit();
}

/// Locks the table from another session, checks the fall (G3), unlocks it
/// and checks the rise (G4).
void slow_down_and_recover(const std::string& name, const std::string& statement, bulkhead::limit_reason expected) {
    auto monitor = outside_connection();
    prepare_table(monitor);
    bulkhead::pqxx_pool pool(pool_options(name, adaptive_permits));
    bulkhead::db_bulkhead<bulkhead::pqxx_pool> gate(
        pool, {.concurrent = adaptive_permits, .extra_slots = 32, .adaptive = bulkhead::adaptive_options{.floor = 1}});
    offered_load load(gate, statement);
    const int quiet = settled_limit(gate);
    INFO("quiet limit " << quiet << ", baseline " << gate.stats().latency_baseline.count() << " ns");
    REQUIRE(quiet >= 2);  // room to fall

    auto locker = outside_connection();
    pqxx::work lock(locker);
    lock.exec("LOCK TABLE bulkhead_adaptive IN ACCESS EXCLUSIVE MODE");
    const auto fell = until(gate, 2s, [&](int limit) { return limit < quiet; });
    const bulkhead::limit_reason why = gate.stats().limit_reason;
    const auto floor = until(gate, 5s, [&](int limit) { return limit == 1; });
    // The server's recovery: the lock goes, the waiting statements run.
    lock.commit();
    const auto rose = until(gate, 5s, [&](int limit) { return limit >= quiet; });
    load.stop();
    const bulkhead::gate_stats stats = gate.stats();
    std::printf(
        "adaptive: %s: quiet limit %d (baseline %.3f ms); locked: below it after %lld ms (%s), at the floor "
        "after %lld ms; unlocked: back to %d after %lld ms; %llu changes, %ld failed calls\n",
        name.c_str(), quiet, static_cast<double>(stats.latency_baseline.count()) / 1e6,
        static_cast<long long>(fell.count()), std::string(bulkhead::to_string(why)).c_str(),
        static_cast<long long>(floor.count()), quiet, static_cast<long long>(rose.count()),
        static_cast<unsigned long long>(stats.limit_changes), load.failed());
    CHECK(fell <= 2s);  // G3
    // The first fall comes from the expected rule, or from the latency rule:
    // the calls that finished in the interval the lock arrived in, or the
    // CPU of a busy machine (CI's dev stage runs beside other builds), can
    // take the mean hold past 1.5 x the baseline before a whole interval
    // stalls or times out (seen: "latency" at 261 ms, then the floor at
    // 523 ms). Each rule alone is proven on simulated intervals
    // (tests/unit/adaptive_limit_test.cpp); here the server's slowdown must
    // lower the limit in time, for a reason that says the database slowed.
    CHECK((why == expected || why == bulkhead::limit_reason::latency));
    CHECK(rose <= 5s);  // G4
    CHECK(stats.running == 0);
    CHECK(stats.queued == 0);
    CHECK(stats.available == gate.limit());
    CHECK(stats.available_slots == adaptive_permits + 32);
}

}  // namespace

TEST_CASE(
    "[G3] an adaptive gate's limit falls within 2 s of the database slowing down: a lock stalls every call, "
    "or lock timeouts (55P03) fail them",
    "[pg][G3][adaptive]") {
    SECTION("the calls wait on the lock: stalled") {
        slow_down_and_recover("bulkhead-g3-stalled", "SELECT count(*) FROM bulkhead_adaptive, pg_sleep(0.002)",
                              bulkhead::limit_reason::stalled);
    }
    SECTION("the calls time out on the lock (SQLSTATE 55P03): errors") {
        slow_down_and_recover(
            "bulkhead-g3-errors",
            "SET LOCAL lock_timeout = '20ms'; SELECT count(*) FROM bulkhead_adaptive, pg_sleep(0.002)",
            bulkhead::limit_reason::errors);
    }
}

TEST_CASE("[G4] an adaptive gate's limit rises back within 5 s of the database's recovery", "[pg][G4][adaptive]") {
    // slow_down_and_recover() checks both; this case runs the stalled one
    // once more, so that G4 has a test named after it.
    slow_down_and_recover("bulkhead-g4", "SELECT count(*) FROM bulkhead_adaptive, pg_sleep(0.002)",
                          bulkhead::limit_reason::stalled);
}

namespace {

/// A statement that fails on the server with `sqlstate`, and what an
/// adaptive gate must conclude from its failures.
struct server_error {
    std::string sqlstate;
    std::string statement;
    bool cuts = false;                                                // the limit must fall, for `reason`
    bulkhead::limit_reason reason = bulkhead::limit_reason::initial;  // (when it cuts)
};

/// A statement that raises `sqlstate` from PL/pgSQL: for the states a test
/// server cannot be driven into on demand (out of memory, too many
/// connections on a connection already open, a deadlock's victim); libpq
/// and libpqxx see them as they would the real thing.
std::string raise_statement(const std::string& sqlstate) {
    return "DO $$BEGIN RAISE EXCEPTION 'bulkhead test: " + sqlstate + "' USING ERRCODE = '" + sqlstate + "'; END$$";
}

/// The SQLSTATE the statement fails with, run once through `gate`. libpqxx
/// throws 53300 as too_many_connections, and libpqxx 6 throws 40001 and
/// 40P01 as serialization_failure and deadlock_detected: none of them a
/// sql_error with a sqlstate() there.
std::string failing_sqlstate(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate, const std::string& statement) {
    try {
        return sqlstate_of([&] {
            gate.transaction(bulkhead::db_bulkhead<bulkhead::pqxx_pool>::options{},
                             [&](pqxx::dbtransaction& tx) { (void)tx.exec(statement); });
        });
    } catch (const pqxx::too_many_connections&) {
        return "53300";
    } catch (const pqxx::serialization_failure&) {
        return "40001";
    } catch (const pqxx::deadlock_detected&) {
        return "40P01";
    }
}

}  // namespace

TEST_CASE(
    "[G3] the server's overload errors lower an adaptive gate's limit within 2 s: class 53 halves it (saturated), "
    "57014, 55P03, 40001 and 40P01 cut it (errors), other errors leave it",
    "[pg][G3][adaptive]") {
    const server_error error =
        GENERATE(server_error{"53300", raise_statement("53300"), true, bulkhead::limit_reason::saturated},
                 server_error{"53200", raise_statement("53200"), true, bulkhead::limit_reason::saturated},
                 // A real statement timeout, and a real lock refused (the row is
                 // locked from outside below).
                 server_error{"57014", "SET LOCAL statement_timeout = '1ms'; SELECT pg_sleep(0.05)", true,
                              bulkhead::limit_reason::errors},
                 server_error{"55P03", "SELECT id FROM bulkhead_adaptive WHERE id = 1 FOR UPDATE NOWAIT", true,
                              bulkhead::limit_reason::errors},
                 server_error{"40001", raise_statement("40001"), true, bulkhead::limit_reason::errors},
                 server_error{"40P01", raise_statement("40P01"), true, bulkhead::limit_reason::errors},
                 // The callers' own mistake says nothing of the server's load.
                 server_error{"22012", "SELECT 1 / 0", false, bulkhead::limit_reason::initial});
    INFO("SQLSTATE " << error.sqlstate << ": " << error.statement);

    auto monitor = outside_connection();
    prepare_table(monitor);
    const std::string name = "bulkhead-g3-" + error.sqlstate;
    bulkhead::pqxx_pool pool(pool_options(name, adaptive_permits));
    bulkhead::db_bulkhead<bulkhead::pqxx_pool> gate(
        pool, {.concurrent = adaptive_permits, .extra_slots = 32, .adaptive = bulkhead::adaptive_options{.floor = 1}});
    auto quiet_load = std::make_unique<offered_load>(gate, "SELECT count(*) FROM bulkhead_adaptive, pg_sleep(0.002)");
    // The error rules need no baseline: a limit that the slow start has
    // taken past the floor has room to fall.
    REQUIRE(until(gate, 10s, [](int limit) { return limit >= 2; }) <= 10s);
    quiet_load.reset();
    const int quiet = gate.limit();
    INFO("quiet limit " << quiet);
    REQUIRE(quiet >= 2);  // room to fall

    auto locker = outside_connection();
    pqxx::work row_lock(locker);
    (void)row_lock.exec("SELECT id FROM bulkhead_adaptive WHERE id = 1 FOR UPDATE");
    // The statement fails as named, on this server and library version:
    // otherwise the rest would test another SQLSTATE.
    REQUIRE(failing_sqlstate(gate, error.statement) == error.sqlstate);

    offered_load failing(gate, error.statement);
    const auto fell = until(gate, 2s, [&](int limit) {
        const bulkhead::limit_reason why = gate.stats().limit_reason;
        return limit < quiet && (why == bulkhead::limit_reason::saturated || why == bulkhead::limit_reason::errors);
    });
    const bulkhead::gate_stats stats = gate.stats();
    failing.stop();
    row_lock.abort();
    std::printf("adaptive: SQLSTATE %s: quiet limit %d; failing: limit %d (%s) after %lld ms, %ld failed calls\n",
                error.sqlstate.c_str(), quiet, stats.limit,
                std::string(bulkhead::to_string(stats.limit_reason)).c_str(), static_cast<long long>(fell.count()),
                failing.failed());
    CHECK(failing.failed() > 0);
    if (error.cuts) {
        CHECK(fell <= 2s);  // G3
        CHECK(stats.limit_reason == error.reason);
        CHECK(stats.limit < quiet);
    } else {
        // Two seconds of nothing but failures: none of them counts as
        // the server's overload.
        CHECK(fell > 2s);
    }
}
