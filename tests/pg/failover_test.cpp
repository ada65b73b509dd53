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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <string>
#include <thread>
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
          // target_session_attrs=any: the lookup reaches whatever server
          // answers behind the proxy, and must tell it apart itself (the
          // pool's default, primary, would not connect to a standby).
          pool(lookup_pool_options(
              server.conninfo() + " host=127.0.0.1 port=" + std::to_string(proxy.port()) + " target_session_attrs=any",
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

namespace {

/// One call of a writer thread in a failover run.
struct timed_write {
    write_outcome outcome;
    bool rejected = false;  // bulkhead::rejected: the work never started
    long long id = 0;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;
};

/// Inserts row `id` into `table` through `gate` within `deadline`, timed.
timed_write timed_write_row(failover_gate& gate, const std::string& table, long long id,
                            std::chrono::milliseconds deadline) {
    timed_write call;
    call.id = id;
    call.start = std::chrono::steady_clock::now();
    try {
        gate.transaction({.deadline = call.start + deadline}, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table + " VALUES (" + std::to_string(id) + ")");
        });
        call.outcome = {write_outcome::kind::committed, {}};
    } catch (const bulkhead::rejected& refusal) {
        call.rejected = true;
        call.outcome = {write_outcome::kind::failed, refusal.what()};
    } catch (const bulkhead::commit_unknown& unknown) {
        call.outcome = {write_outcome::kind::commit_unknown, unknown.what()};
    } catch (const std::exception& failure) {
        call.outcome = {write_outcome::kind::failed, failure.what()};
    }
    call.end = std::chrono::steady_clock::now();
    return call;
}

long long ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

}  // namespace

TEST_CASE("[I2] writes resume within 2 s of a standby's promotion, every call in time, every permit back",
          "[pg][I2][I4][direct]") {
    // The pool's conninfo lists both servers and sets no
    // target_session_attrs: the pool's default (primary) is what moves it
    // to the promoted standby. Synchronous replication: every write
    // reported committed is on the standby when the primary dies.
    using namespace std::chrono_literals;
    constexpr int writers = 4;
    constexpr auto deadline = 500ms;
    replicated_cluster cluster;
    run_sql(cluster.primary().conninfo(), "CREATE TABLE i2_rows (id bigint PRIMARY KEY)");
    cluster.make_synchronous();
    auto options = pool_options("bulkhead-i2", writers);
    options.conninfo = cluster.both_hosts("");
    const std::chrono::milliseconds slack = options.deadline_slack;
    bulkhead::pqxx_pool pool(options);
    failover_gate gate(pool, writers, writers);

    std::atomic<bool> done{false};
    std::atomic<long long> next_id{0};
    std::atomic<int> committed{0};
    std::vector<std::vector<timed_write>> calls(writers);
    std::vector<std::thread> threads;
    threads.reserve(writers);
    for (int w = 0; w < writers; ++w) {
        threads.emplace_back([&, w] {
            while (!done.load()) {
                calls[static_cast<std::size_t>(w)].push_back(timed_write_row(gate, "i2_rows", next_id++, deadline));
                if (calls[static_cast<std::size_t>(w)].back().outcome.how == write_outcome::kind::committed) {
                    ++committed;
                }
            }
        });
    }
    const auto wait_for_commits = [&](int count) {
        const auto give_up = std::chrono::steady_clock::now() + 20s;
        while (committed.load() < count && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::sleep_for(5ms);  // polls the writers' count
        }
        return committed.load() >= count;
    };
    const bool warmed_up = wait_for_commits(40);

    // The primary dies; nothing takes writes until the promotion.
    const auto lost_at = std::chrono::steady_clock::now();
    const int committed_before = committed.load();
    cluster.lose_primary();
    // [I4] Meanwhile a rejection says why: the pool's last connection error.
    // A call of its own, outside the writers' counts, after the pool has
    // failed to connect at least once.
    const auto failing_give_up = std::chrono::steady_clock::now() + 10s;
    while (pool.health().last_error.empty() && std::chrono::steady_clock::now() < failing_give_up) {
        std::this_thread::sleep_for(5ms);  // polls the pool's state
    }
    const auto failing_at = std::chrono::steady_clock::now();
    const std::string pool_error = pool.health().last_error;
    std::string outage_refusal;
    try {
        gate.transaction({.queue_wait = 200ms, .deadline = std::chrono::steady_clock::now() + 200ms},
                         [](pqxx::dbtransaction& tx) { exec_no_rows(tx, "SELECT 1"); });
    } catch (const bulkhead::rejected& refusal) {
        outage_refusal = refusal.what();
    } catch (const std::exception& failure) {
        outage_refusal = std::string("not a rejection: ") + failure.what();
    }
    // The gap is counted from the start of the promotion (pg_ctl promote
    // returns once the standby takes writes).
    const auto promoted_at = std::chrono::steady_clock::now();
    cluster.promote_standby();
    const int committed_at_promotion = committed.load();
    const bool resumed = wait_for_commits(committed_at_promotion + 20);
    done = true;
    for (std::thread& thread : threads) {
        thread.join();
    }

    int total = 0;
    int ok = 0;
    int rejected = 0;
    int unknown = 0;
    int failed = 0;
    std::vector<std::string> refused_without_cause;
    long long longest_ms = 0;
    auto first_after = std::chrono::steady_clock::time_point::max();
    std::vector<long long> committed_ids;
    for (const auto& thread_calls : calls) {
        for (const timed_write& call : thread_calls) {
            ++total;
            longest_ms = std::max(longest_ms, ms_between(call.start, call.end));
            INFO("call " << call.id << ": " << call.outcome.message);
            CHECK(call.end - call.start <= deadline + slack + 250ms);
            if (call.outcome.how == write_outcome::kind::committed) {
                ++ok;
                committed_ids.push_back(call.id);
                if (call.end >= promoted_at) {
                    first_after = std::min(first_after, call.end);
                }
            } else if (call.outcome.how == write_outcome::kind::commit_unknown) {
                ++unknown;
            } else if (call.rejected) {
                ++rejected;
                // A refusal that began once the pool had failed to connect,
                // and ended before the promotion, names the pool's error.
                if (call.start >= failing_at && call.end < promoted_at &&
                    call.outcome.message.find("the pool's last connection error") == std::string::npos) {
                    refused_without_cause.push_back(call.outcome.message);
                }
            } else {
                ++failed;
            }
        }
    }
    long long missing = 0;
    for (const long long id : committed_ids) {
        missing +=
            value_of(cluster.primary().conninfo(), "SELECT count(*) FROM i2_rows WHERE id = " + std::to_string(id)) == 0
                ? 1
                : 0;
    }
    const long long gap_ms =
        first_after == std::chrono::steady_clock::time_point::max() ? -1 : ms_between(promoted_at, first_after);
    std::printf(
        "failover: [I2] %d calls: %d committed, %d commit_unknown, %d rejected, %d failed; longest %lld ms "
        "(deadline %lld + slack %lld); outage %lld ms; writes back %lld ms after the promotion began; %lld rows "
        "missing\n",
        total, ok, unknown, rejected, failed, longest_ms, static_cast<long long>(deadline.count()),
        static_cast<long long>(slack.count()), ms_between(lost_at, promoted_at), gap_ms, missing);
    std::printf("failover: [I2] a refusal during the outage: %s\n", outage_refusal.c_str());
    INFO("pool error: " << pool_error);
    CHECK(warmed_up);
    CHECK(committed_before >= 40);
    CHECK(resumed);
    CHECK(gap_ms >= 0);
    CHECK(gap_ms <= 2000);
    CHECK(missing == 0);
    for (const std::string& message : refused_without_cause) {
        UNSCOPED_INFO("refused without the pool's error: " << message);
    }
    CHECK(refused_without_cause.empty());
    CHECK_FALSE(pool_error.empty());
    // The error of the pool's latest attempt: not necessarily pool_error's.
    CHECK_THAT(outage_refusal, Catch::Matchers::StartsWith("db ") &&
                                   Catch::Matchers::ContainsSubstring("; the pool's last connection error: "));
    CHECK(gate.available() == writers);
    CHECK(gate.in_flight() == 0);
}

TEST_CASE("[I3] a host list with the standby first: the pool connects to the primary, once", "[pg][I3][direct]") {
    using namespace std::chrono_literals;
    replicated_cluster cluster;
    run_sql(cluster.primary().conninfo(), "CREATE TABLE i3_rows (id int)");
    auto options = pool_options("bulkhead-i3-order", 2);
    options.conninfo = cluster.standby_first("");
    bulkhead::pqxx_pool pool(options);
    failover_gate gate(pool, 2, 0);
    for (int id = 0; id < 20; ++id) {
        const write_outcome outcome = write_row(gate, "i3_rows", std::to_string(id));
        INFO(outcome.message);
        CHECK(outcome.how == write_outcome::kind::committed);
    }
    CHECK(value_of(cluster.primary().conninfo(), "SELECT count(*) FROM i3_rows") == 20);
    const bulkhead::pool_stats stats = pool.stats();
    CHECK(stats.opened == 1);  // one caller at a time: one connection, never reopened
    CHECK(stats.connect_failures == 0);
}

TEST_CASE("[I3] a connection whose server turns read-only is closed on its return, and the rejections say why",
          "[pg][I3][I4][direct]") {
    // target_session_attrs=read-write: the pool needs sessions whose
    // default_transaction_read_only is off. An operator turns it on (as a
    // server whose disk fills is protected): a direct lease's write fails
    // with 25006, and its connection is not kept.
    using namespace std::chrono_literals;
    private_cluster server;
    run_sql(server.conninfo(), "CREATE TABLE i3_rows (id int)");
    auto options = pool_options("bulkhead-i3-read-only", 1);
    options.conninfo = server.conninfo() + " target_session_attrs=read-write";
    bulkhead::pqxx_pool pool(options);
    failover_gate gate(pool, 1, 0);
    {
        auto lease = pool.acquire();
        run_sql(server.conninfo(), "ALTER SYSTEM SET default_transaction_read_only = on");
        run_sql(server.conninfo(), "SELECT pg_reload_conf()");
        // The lease's backend reads the new setting before its next command.
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        for (;;) {
            pqxx::nontransaction tx(lease.connection());
            if (exec_one_row(tx, "SHOW default_transaction_read_only")[0].as<std::string>() == "on") {
                break;
            }
            REQUIRE(std::chrono::steady_clock::now() < give_up);
            std::this_thread::sleep_for(10ms);  // polls the server's state
        }
        pqxx::work tx(lease.connection());
        try {
            tx.exec("INSERT INTO i3_rows VALUES (1)");
            FAIL("the write on a read-only session succeeded");
        } catch (const pqxx::sql_error& failure) {
            CHECK(failure.sqlstate() == "25006");
        }
    }
    CHECK(pool.stats().closed_for(bulkhead::close_reason::read_only) == 1);
    CHECK(pool.stats().idle == 0);

    // No server takes writes now: the rejection names libpq's reason.
    std::string refusal;
    try {
        gate.transaction({.deadline = std::chrono::steady_clock::now() + 300ms},
                         [](pqxx::dbtransaction& tx) { exec_no_rows(tx, "SELECT 1"); });
    } catch (const bulkhead::rejected& rejection) {
        refusal = rejection.what();
    }
    CHECK_THAT(refusal, Catch::Matchers::ContainsSubstring("the pool's last connection error: "));
    CHECK_THAT(refusal, Catch::Matchers::ContainsSubstring("read-only"));
    CHECK_THAT(pool.health().last_error, Catch::Matchers::ContainsSubstring("read-only"));

    // Writable again: the next call connects and commits.
    run_sql(server.conninfo(), "ALTER SYSTEM RESET default_transaction_read_only");
    run_sql(server.conninfo(), "SELECT pg_reload_conf()");
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    write_outcome outcome;
    do {
        REQUIRE(std::chrono::steady_clock::now() < give_up);
        std::this_thread::sleep_for(20ms);  // the reload, then the pool's back-off
        outcome = write_row(gate, "i3_rows", "2");
    } while (outcome.how != write_outcome::kind::committed);
    CHECK(pool.health().last_error.empty());
    CHECK(value_of(server.conninfo(), "SELECT count(*) FROM i3_rows") == 1);
}

TEST_CASE("[I5] reads run on the standby, on the primary while it is down, and on it again soon after it returns",
          "[pg][I5][direct]") {
    // A pool for reads: target_session_attrs=prefer-standby over the host
    // list. A connection that had to fall back to the primary lives
    // fallback_lifetime, then the next connect tries the standby again.
    using namespace std::chrono_literals;
    replicated_cluster cluster;
    auto options = pool_options("bulkhead-i5", 2);
    options.conninfo = cluster.both_hosts("target_session_attrs=prefer-standby");
    options.fallback_lifetime = 1s;
    bulkhead::pqxx_pool pool(options);
    failover_gate gate(pool, 2, 0);
    // True when the read ran on a standby; nothing when the call failed.
    const auto read_on_standby = [&gate]() -> std::optional<bool> {
        failover_gate::options call;
        call.deadline = std::chrono::steady_clock::now() + 2s;
        call.transaction.read_only = true;
        try {
            return gate.transaction(call, [](pqxx::dbtransaction& tx) {
                return exec_one_row(tx, "SELECT pg_is_in_recovery()")[0].as<bool>();
            });
        } catch (const std::exception& failure) {
            UNSCOPED_INFO("a read failed: " << failure.what());
            return std::nullopt;
        }
    };
    // Reads until one ran where `on_standby` says, for at most `bound`;
    // returns how long that took, or nothing.
    const auto until_read = [&](bool on_standby, std::chrono::milliseconds bound) -> std::optional<long long> {
        const auto from = std::chrono::steady_clock::now();
        while (std::chrono::steady_clock::now() - from < bound) {
            if (read_on_standby() == on_standby) {
                return ms_between(from, std::chrono::steady_clock::now());
            }
            std::this_thread::sleep_for(20ms);  // a reader's pace
        }
        return std::nullopt;
    };
    CHECK(read_on_standby() == true);

    cluster.standby()->stop_server();
    const std::optional<long long> to_primary = until_read(false, 5s);
    CHECK(to_primary.has_value());

    cluster.standby()->start_server();
    const std::optional<long long> back = until_read(true, 5s);
    REQUIRE(back.has_value());
    std::printf(
        "failover: [I5] reads on the primary %lld ms after the standby stopped, on the standby again %lld ms "
        "after it restarted (fallback_lifetime 1000 ms)\n",
        to_primary.value_or(-1), *back);
    CHECK(*back <= 1000 + 1000);  // fallback_lifetime, and a reader's pace and connect
    CHECK(pool.stats().closed_for(bulkhead::close_reason::lifetime) >= 1);
    CHECK(gate.available() == 2);
}
