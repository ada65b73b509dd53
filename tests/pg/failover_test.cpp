// Contract I1: a lost COMMIT is settled only on the server and timeline where
// the transaction ran. Anywhere else (a promoted standby, a standby, another
// cluster behind the same address, the same server after a restart) the
// outcome is bulkhead::commit_unknown, never committed or rolled back.
//
// Every test here makes servers of its own (private_cluster,
// replicated_cluster) and is tagged [direct]: the pgbouncer pass would run
// the same servers again, with nothing of PgBouncer's in the path.
//
// The unit of proof is rows: after each run, every call reported committed
// has its row on the surviving primary. The figures of each failover round
// are printed as "failover: ..." lines (.ci/run collects them).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pg_replication.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"

#include "catch.hpp"

#include <cstdio>
#include <future>
#include <string>
#include <vector>

using namespace bulkhead_test;

namespace {

using failover_gate = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

/// How one write through the gate ended.
struct write_outcome {
    enum class kind { committed, commit_unknown, failed };
    kind how = kind::failed;
    std::string message;
};

/// Inserts `row` into `table` through `gate` and says how the call ended.
write_outcome write_row(failover_gate& gate, const std::string& table, const std::string& row) {
    try {
        gate.transaction(std::chrono::seconds(30), [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table + " VALUES (" + row + ")");
        });
        return {write_outcome::kind::committed, {}};
    } catch (const bulkhead::commit_unknown& unknown) {
        return {write_outcome::kind::commit_unknown, unknown.what()};
    } catch (const std::exception& failure) {
        return {write_outcome::kind::failed, failure.what()};
    }
}

/// Runs `sql` (no rows) on a connection of its own to `conninfo`.
void run_sql(const std::string& conninfo, const std::string& sql) {
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    tx.exec(sql);
}

/// The one value `sql` returns, on a connection of its own to `conninfo`.
long long value_of(const std::string& conninfo, const std::string& sql) {
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    return exec_one_row(tx, sql)[0].as<long long>();
}

/// Gives out and commits `count` transaction ids on `conninfo`'s server, so
/// that an id handed out before on another server has a committed
/// namesake here (what a busy promoted standby does within moments).
void burn_ids(const std::string& conninfo, int count) {
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    for (int i = 0; i < count; ++i) {
        tx.exec("SELECT txid_current()");
    }
}

/// Options for a pool on `conninfo` whose lookup of a lost COMMIT may take
/// up to 10 s (connection_timeout), far longer than any failover here.
bulkhead::pqxx_pool_options lookup_pool_options(const std::string& conninfo, const std::string& application_name,
                                                std::size_t max_size) {
    auto options = pool_options(application_name, max_size);
    options.conninfo = conninfo;
    options.connection_timeout = std::chrono::seconds(10);
    return options;
}

/// A gate of one permit over a pool of one connection to `server` through
/// its own proxy, with a table `failover_rows (id int)` on that server and
/// the connection already open: the proxy can then be pointed elsewhere, so
/// that only the lookup of a lost COMMIT reaches another server.
struct redirected_commit {
    explicit redirected_commit(const private_cluster& server, const std::string& application_name)
        : proxy("127.0.0.1", server.port()),
          pool(lookup_pool_options(server.conninfo() + " host=127.0.0.1 port=" + std::to_string(proxy.port()),
                                   application_name, 1)),
          gate(pool, 1, 0),
          server_conninfo(server.conninfo()) {
        run_sql(server_conninfo, "CREATE TABLE failover_rows (id int)");
        gate.transaction(std::chrono::seconds(5), [](pqxx::dbtransaction&) {});  // opens the connection
    }

    /// Writes row 1; its COMMIT never reaches the server (the proxy closes
    /// both sockets before it), so the server rolls it back. Asserts
    /// nothing: it may run on a thread of its own.
    write_outcome lose_commit() {
        proxy.arm(tcp_proxy::cut::drop_before_commit);
        return write_row(gate, "failover_rows", "1");
    }

    [[nodiscard]] long long rows() const { return value_of(server_conninfo, "SELECT count(*) FROM failover_rows"); }

    /// Checks how a lose_commit() ended: cut once by the proxy, `how`, a
    /// message that contains `why`, the row absent (the server rolled it
    /// back) and the permit back.
    void check(const write_outcome& outcome, write_outcome::kind how, const std::string& why) {
        INFO(outcome.message);
        CHECK(proxy.cuts() == 1);
        CHECK(outcome.how == how);
        CHECK_THAT(outcome.message, Catch::Matchers::ContainsSubstring(why));
        CHECK(rows() == 0);
        CHECK(gate.available() == 1);
    }

    tcp_proxy proxy;
    bulkhead::pqxx_pool pool;
    failover_gate gate;
    std::string server_conninfo;
};

}  // namespace

TEST_CASE("[I1] calls in COMMIT when a partitioned synchronous standby is promoted are never reported committed",
          "[pg][I1][direct]") {
    // Three failovers in a row (each round's standby is new, its timeline the
    // next one); one under a sanitizer (BULKHEAD_FAILOVER_ROUNDS): the C++
    // path is the same in every round, and the dev and Debian 13 stages run
    // all three.
    constexpr int rounds = BULKHEAD_FAILOVER_ROUNDS;
    constexpr int calls = 8;
    replicated_cluster cluster;
    run_sql(cluster.primary().conninfo(),
            "CREATE TABLE failover_rows (round int, call int, PRIMARY KEY (round, call))");
    int reported_committed = 0;
    for (int round = 1; round <= rounds; ++round) {
        if (round > 1) {
            cluster.add_standby();
        }
        cluster.make_synchronous();
        const long long timeline =
            value_of(cluster.primary().conninfo(),
                     "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int");
        bulkhead::pqxx_pool pool(
            lookup_pool_options(cluster.both_hosts("target_session_attrs=read-write"), "bulkhead-i1-failover", calls));
        failover_gate gate(pool, calls, 0);
        const std::string primary = cluster.primary().conninfo();

        // The standby hears nothing more; every COMMIT now waits for it.
        cluster.partition();
        std::vector<std::future<write_outcome>> writes;
        writes.reserve(calls);
        for (int call = 0; call < calls; ++call) {
            writes.push_back(std::async(std::launch::async, [&gate, round, call] {
                return write_row(gate, "failover_rows", std::to_string(round) + ", " + std::to_string(call));
            }));
        }
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (value_of(primary, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") < calls) {
            REQUIRE(std::chrono::steady_clock::now() < give_up);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polls the server's state
        }

        // Every call is in COMMIT: the primary dies, the standby is promoted
        // and at once hands out the ids the dead primary had given them.
        cluster.fail_over();
        burn_ids(cluster.primary().conninfo(), 200);

        int committed = 0;
        int unknown = 0;
        int missing = 0;
        for (int call = 0; call < calls; ++call) {
            const write_outcome outcome = writes[static_cast<std::size_t>(call)].get();
            INFO("round " << round << ", call " << call << ": " << outcome.message);
            const long long present =
                value_of(cluster.primary().conninfo(),
                         "SELECT count(*) FROM failover_rows WHERE round = " + std::to_string(round) +
                             " AND call = " + std::to_string(call));
            if (outcome.how == write_outcome::kind::committed) {
                ++committed;
                missing += present == 0 ? 1 : 0;
            } else if (outcome.how == write_outcome::kind::commit_unknown) {
                ++unknown;
                // The lookup reached the promoted standby and saw its new
                // timeline; it asked nothing more.
                CHECK_THAT(outcome.message, Catch::Matchers::ContainsSubstring("timeline " + std::to_string(timeline) +
                                                                               " -> " + std::to_string(timeline + 1)));
            } else {
                FAIL_CHECK("neither committed nor commit_unknown: " << outcome.message);
            }
        }
        std::printf(
            "failover: round %d: %d calls in COMMIT at the kill, %d committed, %d commit_unknown, %d rows "
            "missing\n",
            round, calls, committed, unknown, missing);
        reported_committed += committed;
        CHECK(missing == 0);
        CHECK(unknown == calls);  // nothing can have reached the promoted standby, so nothing can be settled
        CHECK(gate.available() == calls);
    }
    CHECK(reported_committed == 0);
}

TEST_CASE("[I1] a lookup that reaches another cluster behind the same address ends commit_unknown",
          "[pg][I1][direct]") {
    private_cluster first;
    private_cluster other;
    // The other cluster takes the same credentials, and has given out and
    // committed the ids the first is about to give out: its answer would be
    // "committed".
    const std::string password_field = first.conninfo().substr(first.conninfo().find("password="));
    const std::string password = password_field.substr(9, password_field.find(' ') - 9);
    burn_ids(other.conninfo(), 1000);
    run_sql(other.conninfo(), "ALTER ROLE bulkhead PASSWORD '" + password + "'");
    redirected_commit setup(first, "bulkhead-i1-other-cluster");
    setup.proxy.set_upstream_port(other.port());

    setup.check(setup.lose_commit(), write_outcome::kind::commit_unknown, "another cluster: system identifier");
}

TEST_CASE("[I1] a lookup that reaches a standby ends commit_unknown", "[pg][I1][direct]") {
    replicated_cluster cluster;
    redirected_commit setup(cluster.primary(), "bulkhead-i1-standby");
    setup.proxy.set_upstream_port(cluster.standby()->port());

    setup.check(setup.lose_commit(), write_outcome::kind::commit_unknown, "a standby in recovery");
}

TEST_CASE("[I1] a lookup that reaches the same server after a restart ends commit_unknown", "[pg][I1][direct]") {
    private_cluster server;
    redirected_commit setup(server, "bulkhead-i1-restart");
    // No lookup gets through until the server has restarted.
    setup.proxy.refuse_new(true);
    auto lost = std::async(std::launch::async, [&] { return setup.lose_commit(); });
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (setup.proxy.cuts() == 0) {
        REQUIRE(std::chrono::steady_clock::now() < give_up);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls the proxy's count
    }
    server.stop_server();
    server.start_server();
    setup.proxy.refuse_new(false);

    setup.check(lost.get(), write_outcome::kind::commit_unknown, "has restarted since the transaction ran");
}

TEST_CASE("[I1] the same server, not restarted, still settles a lost COMMIT", "[pg][I1][direct]") {
    private_cluster server;
    redirected_commit setup(server, "bulkhead-i1-same");
    setup.check(setup.lose_commit(), write_outcome::kind::failed, "confirms the transaction was rolled back");
}
