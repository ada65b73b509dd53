// What the reference design leaves open, against a real PostgreSQL:
// one deadline bounding every stage, cancellation that reaches the server,
// and COMMIT outcomes that are settled instead of guessed.
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"

#include "catch.hpp"

#include <functional>
#include <future>
#include <latch>
#include <optional>
#include <regex>
#include <stop_token>
#include <string>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

namespace {

template <class Call>
clock_type::duration time_of(Call&& call) {
    const auto start = clock_type::now();
    call();
    return clock_type::now() - start;
}

}  // namespace

// --- 1. One deadline, every stage ------------------------------------------------

TEST_CASE("a deadline that has passed is refused with deadline_exceeded before the pool is touched", "[pg][deadline]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-deadline-passed"));
    gate_t gate(pool, 1, 0);
    const auto elapsed = time_of([&] {
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 1s, .deadline = clock_type::now() - 1ms}, [](pqxx::dbtransaction&) {}),
            bulkhead::deadline_exceeded);
    });
    CHECK(elapsed < 100ms);
    CHECK(pool.size() == 0);  // no connection was even opened
    auto outcome = gate.try_transaction({.deadline = clock_type::now()}, [](pqxx::dbtransaction&) {});
    CHECK(outcome.error() == bulkhead::reject_reason::deadline_exceeded);
    CHECK(gate.available() == 1);
}

TEST_CASE("the deadline cuts the wait for an execution permit short", "[pg][deadline]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-deadline-permit"));
    gate_t gate(pool, 1, 1);
    std::latch holding(1);
    std::promise<void> release;
    auto released = release.get_future().share();
    auto holder = std::async(std::launch::async, [&] {
        gate.transaction(1s, [&](pqxx::dbtransaction&) {
            holding.count_down();
            released.wait();
        });
    });
    holding.wait();
    const auto elapsed = time_of([&] {
        CHECK_THROWS_AS(
            gate.transaction({.queue_wait = 10s, .deadline = clock_type::now() + 150ms}, [](pqxx::dbtransaction&) {}),
            bulkhead::deadline_exceeded);
    });
    CHECK(elapsed >= 150ms);
    CHECK(elapsed < 1s);  // the 10 s queue wait did not apply
    CHECK(gate.available_slots() == 1);
    release.set_value();
    holder.get();
}

TEST_CASE("the deadline cuts the wait for a pool connection short", "[pg][deadline]") {
    auto options = pool_options("bulkhead-deadline-pool", 1);
    options.connection_timeout = 5s;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto taken = pool.acquire();  // outside the gate
    const auto elapsed = time_of([&] {
        CHECK_THROWS_AS(gate.transaction({.deadline = clock_type::now() + 200ms}, [](pqxx::dbtransaction&) {}),
                        bulkhead::deadline_exceeded);
    });
    CHECK(elapsed >= 200ms);
    CHECK(elapsed < 1500ms);  // not the pool's 5 s
    CHECK(gate.available() == 1);
}

TEST_CASE("the deadline bounds the work through statement_timeout, and says it was the cause", "[pg][deadline]") {
    scratch_table table("bulkhead_deadline_work", "id int");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-deadline-work", 1));
    gate_t gate(pool, 1, 0);
    long seen_timeout_ms = -1;
    const auto elapsed = time_of([&] {
        try {
            gate.transaction({.deadline = clock_type::now() + 300ms}, [&](pqxx::dbtransaction& tx) {
                seen_timeout_ms =
                    exec_one_row(tx, "SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'")[0]
                        .as<long>();
                exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
                tx.exec("SELECT pg_sleep(5)");
            });
            FAIL("no exception");
        } catch (const bulkhead::work_deadline_exceeded& exceeded) {
            CHECK(sqlstate_of([&] { std::rethrow_if_nested(exceeded); }) == "57014");
        }
    });
    CHECK(seen_timeout_ms > 0);
    CHECK(seen_timeout_ms <= 300);  // the time left, as an integer number of milliseconds
    CHECK(elapsed >= 250ms);
    CHECK(elapsed < 1500ms);  // not the 5 s of pg_sleep
    CHECK(table.rows() == 0);
    // The same connection serves the next call, with the server's default statement_timeout again.
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        return exec_one_row(tx, "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'")[0]
            .as<std::string>();
    }) == "0");
    CHECK(pool.size() == 1);
}

TEST_CASE("a shorter statement_timeout of the call's own still applies, and is not blamed on the deadline",
          "[pg][deadline]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-deadline-own", 1));
    gate_t gate(pool, 1, 0);
    gate_t::options call{.deadline = clock_type::now() + 10s};
    call.transaction.statement_timeout = 100ms;
    CHECK(sqlstate_of([&] {
              gate.transaction(call, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(3)"); });
          }) == "57014");
}

TEST_CASE("with deadline_sets_lock_timeout the deadline bounds lock waits too", "[pg][deadline]") {
    scratch_table table("bulkhead_deadline_lock", "id int PRIMARY KEY, v int");
    auto setup = outside_connection();
    {
        pqxx::work tx(setup);
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1, 0)");
        tx.commit();
    }
    bulkhead::pqxx_pool pool(pool_options("bulkhead-deadline-lock", 1));
    gate_t gate(pool, 1, 0);
    pqxx::work lock_holder(setup);
    exec_one_row(lock_holder, "SELECT v FROM " + table.name() + " WHERE id = 1 FOR UPDATE");
    gate_t::options call{.deadline = clock_type::now() + 250ms};
    call.transaction.deadline_sets_lock_timeout = true;
    const auto elapsed = time_of([&] {
        try {
            gate.transaction(call, [&](pqxx::dbtransaction& tx) {
                exec_no_rows(tx, "UPDATE " + table.name() + " SET v = 1 WHERE id = 1");
            });
            FAIL("no exception");
        } catch (const bulkhead::work_deadline_exceeded& exceeded) {
            const auto state = sqlstate_of([&] { std::rethrow_if_nested(exceeded); });
            CHECK((state == "55P03" || state == "57014"));
        }
    });
    CHECK(elapsed < 1500ms);
    lock_holder.abort();
}

// --- 2. Cancellation that reaches the server -----------------------------------------

// [direct]: follows one backend in pg_stat_activity through the call and expects the next call on it; through
// PgBouncer each transaction may get another backend ([H6] is the PgBouncer case); left out of the pgbouncer
// pass (docs/pgbouncer.md).
TEST_CASE("a stop request during pg_sleep(10) cancels the statement on the server, the connection is reused",
          "[pg][cancel][direct]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-cancel", 1));
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    std::stop_source source;
    std::latch started(1);
    int pid = 0;
    auto call = std::async(std::launch::async, [&] {
        gate.transaction({.stop = source.get_token()}, [&](pqxx::dbtransaction& tx) {
            pid = exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>();
            started.count_down();
            tx.exec("SELECT pg_sleep(10)");
        });
    });
    started.wait();
    // The statement is running on the server before the stop is requested.
    await([&] {
        return scalar<long>(monitor, "SELECT count(*) FROM pg_stat_activity WHERE pid = " + std::to_string(pid) +
                                         " AND state = 'active' AND query LIKE '%pg_sleep(10)%'") == 1;
    });
    std::this_thread::sleep_for(100ms);  // "cancelled after 100 ms": the scenario under test, not ordering
    CHECK(gate.available() == 0);
    check_cancelled_at_once(source, call);
    CHECK(gate.available() == 1);  // back only once the callback had unwound
    CHECK(scalar<std::string>(monitor, "SELECT state FROM pg_stat_activity WHERE pid = " + std::to_string(pid)) ==
          "idle");
    CHECK(pool.idle() == 1);
    const int again = gate.transaction(
        1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(); });
    CHECK(again == pid);  // the same, healthy connection
}

// --- 3. COMMIT outcomes ------------------------------------------------------------------

TEST_CASE("a COMMIT whose answer is lost after the server committed returns the value", "[pg][commit]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_commit_landed", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-commit-landed"));
    gate_t gate(pool, 1, 0);
    check_lost_commit(gate, pool, proxy, table, commit_cut::after_the_server_committed);
    CHECK(gate.available() == 1);
}

TEST_CASE("a COMMIT lost before it reached the server fails after the rollback is confirmed", "[pg][commit]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_commit_lost", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-commit-lost"));
    gate_t gate(pool, 1, 0);
    check_lost_commit(gate, pool, proxy, table, commit_cut::before_the_server_got_it);
    CHECK(gate.available() == 1);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 2")[0].as<int>(); }) == 2);
}

TEST_CASE("commit_unknown only when the outcome cannot be read back, never a silent retry", "[pg][commit]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_commit_unknown", "id int");
    auto options = proxied_options(proxy, "bulkhead-commit-unknown");
    options.connection_timeout = 300ms;  // also the budget for reading the outcome
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    gate.transaction(1s, [](pqxx::dbtransaction&) {});  // connect while the proxy lets us
    proxy.refuse_new(true);                             // no fresh connection can ask txid_status()
    proxy.arm(tcp_proxy::cut::drop_after_commit);
    int runs = 0;
    try {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            ++runs;
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
        });
        FAIL("no exception");
    } catch (const bulkhead::commit_unknown& unknown) {
        CHECK_THROWS(std::rethrow_if_nested(unknown));  // the original failure travels with it
    }
    CHECK(runs == 1);          // not retried
    CHECK(table.rows() == 1);  // it did commit: "unknown" is not "failed"
    proxy.refuse_new(false);
    CHECK(gate.available() == 1);
}

TEST_CASE("no transaction id is forced: read-write work that only reads gets none, and its lost COMMIT is harmless",
          "[pg][commit]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-commit-txid", 1));
    gate_t gate(pool, 1, 0);
    auto assigned = [&](const gate_t::options& call) {
        return gate.transaction(call, [](pqxx::dbtransaction& tx) {
            return !exec_one_row(tx, "SELECT txid_current_if_assigned()")[0].is_null();
        });
    };
    gate_t::options read_write{};
    gate_t::options read_only{};
    read_only.transaction.read_only = true;
    gate_t::options untracked{};
    untracked.transaction.resolve_commit_outcome = false;
    CHECK_FALSE(assigned(read_write));  // outcome tracking asks for the id at COMMIT, if assigned, never forces one
    CHECK_FALSE(assigned(read_only));
    CHECK_FALSE(assigned(untracked));

    // Its COMMIT's answer lost: the id question said none was assigned, so
    // nothing was written and nothing needs looking up.
    tcp_proxy proxy = proxy_to_server();
    bulkhead::pqxx_pool proxied(proxied_options(proxy, "bulkhead-commit-txid-lost"));
    gate_t proxied_gate(proxied, 1, 0);
    proxy.arm(tcp_proxy::cut::drop_after_commit);
    CHECK_THAT(message_of<pqxx::broken_connection>([&] {
                   proxied_gate.transaction(1s, [](pqxx::dbtransaction& tx) { (void)exec_one_row(tx, "SELECT 1"); });
               }),
               Catch::Matchers::ContainsSubstring("no transaction id was assigned"));
    CHECK(proxy.cuts() == 1);
}

/// A gate of one permit over a pool of one connection that goes through a
/// tcp_proxy, and a scratch table: what the commit-path tests start from.
struct proxied_gate_setup : proxied_gate {
    proxied_gate_setup(const std::string& table_name, const std::string& application_name)
        : proxied_gate(application_name), table(table_name, "id int") {}
    scratch_table table;
};

/// A gate of one permit over a pool of one connection, whose sessions show
/// `application_name` in pg_stat_activity.
struct one_connection_gate {
    explicit one_connection_gate(const std::string& application_name)
        : pool(pool_options(application_name, 1)), gate(pool, 1, 0) {}
    bulkhead::pqxx_pool pool;
    gate_t gate;
};

TEST_CASE("a read-write COMMIT goes in pipeline mode only after a statement that reported a write", "[pg][commit]") {
    proxied_gate_setup s("bulkhead_commit_path", "bulkhead-commit-path");
    const auto commit_of = [&](const std::function<void(pqxx::dbtransaction&)>& work) {
        const int commits = s.proxy.commits();
        const int pipelined = s.proxy.pipelined_commits();
        s.gate.transaction(1s, work);
        REQUIRE(s.proxy.commits() == commits + 1);
        return s.proxy.pipelined_commits() == pipelined + 1 ? "pipelined" : "simple";
    };
    // Reads and session bookkeeping: the id question rides in COMMIT's simple query.
    CHECK(std::string(commit_of([](pqxx::dbtransaction& tx) { (void)exec_one_row(tx, "SELECT 1"); })) == "simple");
    CHECK(std::string(commit_of([](pqxx::dbtransaction& tx) {
              exec_no_rows(tx, "SET LOCAL work_mem = '8MB'");
              exec_no_rows(tx, "SAVEPOINT s");
              exec_no_rows(tx, "RELEASE s");
          })) == "simple");
    // A statement that reported a write: the pipeline, the id ahead of COMMIT.
    CHECK(std::string(commit_of([&](pqxx::dbtransaction& tx) {
              exec_no_rows(tx, "INSERT INTO " + s.table.name() + " VALUES (1)");
          })) == "pipelined");
    CHECK(std::string(commit_of([&](pqxx::dbtransaction& tx) {
              (void)exec_one_row(tx, "SELECT 1");
              exec_no_rows(tx, "UPDATE " + s.table.name() + " SET id = 2");
              (void)exec_one_row(tx, "SELECT 1");
          })) == "pipelined");
    CHECK(s.table.rows() == 1);
    CHECK(s.gate.available() == 1);
}

TEST_CASE("a write no command tag shows is resolved when the id's answer arrives, and commit_unknown when it is lost",
          "[pg][commit]") {
    proxied_gate_setup s("bulkhead_commit_hidden_write", "bulkhead-commit-hidden-write");
    // The server calls this a SELECT; it inserts a row and so has an id.
    const std::string hidden_write =
        "WITH w AS (INSERT INTO " + s.table.name() + " VALUES (1) RETURNING id) SELECT count(*) FROM w";
    const auto work = [&](pqxx::dbtransaction& tx) { return exec_one_row(tx, hidden_write)[0].as<int>(); };

    // COMMIT's answer lost, the id's heard: the server is asked, and says committed.
    s.proxy.arm(tcp_proxy::cut::drop_after_commit);
    CHECK(s.gate.transaction(1s, work) == 1);
    CHECK(s.proxy.cuts() == 1);
    CHECK(s.table.rows() == 1);

    // Both lost: nothing to ask with, and nothing guessed.
    s.proxy.arm(tcp_proxy::cut::drop_commit_and_id);
    CHECK_THAT(message_of<bulkhead::commit_unknown>([&] { (void)s.gate.transaction(1s, work); }),
               Catch::Matchers::ContainsSubstring("transaction's id was lost too"));
    CHECK(s.proxy.cuts() == 2);
    CHECK(s.table.rows() == 2);  // it did commit: "unknown" is not "failed"
    CHECK(s.proxy.pipelined_commits() == 0);
    CHECK(s.gate.available() == 1);
}

TEST_CASE("a COMMIT whose answer is lost together with the transaction id's is commit_unknown, never a guess",
          "[pg][commit]") {
    proxied_gate_setup s("bulkhead_commit_id_lost", "bulkhead-commit-id-lost");
    s.proxy.arm(tcp_proxy::cut::drop_commit_and_id);
    CHECK_THAT(message_of<bulkhead::commit_unknown>([&] {
                   s.gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
                       exec_no_rows(tx, "INSERT INTO " + s.table.name() + " VALUES (1)");
                   });
               }),
               Catch::Matchers::ContainsSubstring("transaction's id was lost too"));
    CHECK(s.proxy.cuts() == 1);
    CHECK(s.table.rows() == 1);  // it did commit: "unknown" is not "failed"
    CHECK(s.gate.available() == 1);
}

// --- 4. What libpq already knows is not asked of the server ------------------------------

TEST_CASE("a commit after a caught SQL error sends no COMMIT and fails with 25P02, a clean one sends one COMMIT",
          "[pg][commit]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_commit_failed_tx", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-commit-failed-tx"));
    gate_t gate(pool, 1, 0);
    const int commits_before = proxy.commits();
    try {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
            try {
                tx.exec("SELECT 1/0");
            } catch (const pqxx::sql_error&) {
                // swallowed: the transaction is now failed on the server
            }
        });
        FAIL("the commit of a failed transaction succeeded");
    } catch (const pqxx::sql_error& error) {
        CHECK(error.sqlstate() == "25P02");
        CHECK(error.query() == "COMMIT");
    }
    CHECK(proxy.commits() == commits_before);  // libpq's status said INERROR: COMMIT never went out
    CHECK(table.rows() == 0);
    CHECK(pool.size() == 1);  // rolled back by the gate, and kept
    gate.transaction(1s,
                     [&](pqxx::dbtransaction& tx) { exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (2)"); });
    CHECK(proxy.commits() == commits_before + 1);
    CHECK(table.rows() == 1);
}

TEST_CASE("a lease used directly is checked on return without a round trip, reset when idle, closed inside a block",
          "[pg][pool]") {
    tcp_proxy proxy = proxy_to_server();
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-raw-return"));
    // Runs `statements` on a lease's connection directly (errors caught),
    // returns the lease, and says how many queries the return itself sent.
    const auto use_and_return = [&](const std::vector<std::string>& statements) {
        int sent = 0;
        {
            auto lease = pool.acquire();
            {
                pqxx::nontransaction raw(lease.connection());
                for (const std::string& statement : statements) {
                    try {
                        raw.exec(statement);
                    } catch (const pqxx::sql_error&) {
                        // a failed transaction block is one of the cases
                    }
                }
            }
            sent = proxy.queries();
        }
        return proxy.queries() - sent;
    };
    // Kept: one query goes out, the session reset ([E8]); the check itself
    // reads libpq's status.
    CHECK(use_and_return({"SELECT 1"}) == 1);
    CHECK(pool.idle() == 1);
    CHECK(use_and_return({"BEGIN", "SELECT 1"}) == 0);
    CHECK(pool.size() == 0);  // closed: the session was still inside a transaction block
    CHECK(use_and_return({"BEGIN", "SELECT 1/0"}) == 0);
    CHECK(pool.size() == 0);  // closed: a failed transaction block
    CHECK(use_and_return({"BEGIN", "COMMIT"}) == 1);
    CHECK(pool.idle() == 1);
    CHECK(pool.stats().closed_for(bulkhead::close_reason::validation_failed) == 2);
}

// --- 5. BEGIN carries the first statement (bulkhead::pqxx_transaction) ------------------

TEST_CASE("[E9] a first statement whose deferred BEGIN never reached the server runs nowhere and is not retried",
          "[pg][E9][J1]") {
    proxied_gate_setup s("bulkhead_first_lost", "bulkhead-first-lost");
    s.gate.transaction(1s, [](pqxx::dbtransaction& tx) { (void)exec_one_row(tx, "SELECT 1"); });  // open, idle
    s.proxy.arm(tcp_proxy::cut::drop_at_next_query);
    const std::string insert = "INSERT INTO " + s.table.name() + " VALUES (1)";
    int runs = 0;
    CHECK_THROWS_AS(s.gate.transaction(1s,
                                       [&](bulkhead::pqxx_transaction& tx) {
                                           ++runs;
                                           (void)tx.exec(insert);
                                       }),
                    pqxx::broken_connection);
    CHECK(runs == 1);  // not retried
    CHECK(s.proxy.cuts() == 1);
    CHECK(s.table.rows() == 0);
    CHECK(s.gate.available() == 1);
}

TEST_CASE(
    "a first statement with its deferred BEGIN that runs into the deadline is work_deadline_exceeded, within the "
    "deadline and slack",
    "[pg][J1]") {
    one_connection_gate setup("bulkhead-first-deadline");
    bulkhead::pqxx_pool& pool = setup.pool;
    gate_t& gate = setup.gate;
    gate_t::options call{};
    call.deadline = clock_type::now() + 300ms;
    const auto started = clock_type::now();
    CHECK_THROWS_AS(gate.transaction(call, [](bulkhead::pqxx_transaction& tx) { (void)tx.exec("SELECT pg_sleep(5)"); }),
                    bulkhead::work_deadline_exceeded);
    const auto took = clock_type::now() - started;
    CHECK(took >= 290ms);
    CHECK(took < 300ms + pool.options().deadline_slack + 500ms);
    CHECK(gate.stats().work_deadline_exceeded == 1);
    CHECK(gate.available() == 1);
}

TEST_CASE("[E3] a first statement with its deferred BEGIN that ends the transaction block is refused like any",
          "[pg][E3][J1]") {
    one_connection_gate setup("bulkhead-first-commit");
    gate_t& gate = setup.gate;
    CHECK_THROWS_AS(gate.transaction(1s, [](bulkhead::pqxx_transaction& tx) { (void)tx.exec("COMMIT"); }),
                    std::logic_error);
    CHECK(gate.available() == 1);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 1")[0].as<int>(); }) == 1);
}

TEST_CASE(
    "[E5] a stop request during a first statement with its deferred BEGIN cancels it on the server: work_cancelled",
    "[pg][E5][J1]") {
    one_connection_gate setup("bulkhead-first-cancel");
    gate_t& gate = setup.gate;
    auto monitor = outside_connection();
    std::stop_source source;
    auto call = std::async(std::launch::async, [&] {
        gate.transaction({.stop = source.get_token()},
                         [](bulkhead::pqxx_transaction& tx) { (void)tx.exec("SELECT pg_sleep(10)"); });
    });
    // The statement is running on the server before the stop is requested.
    await([&] { return running(monitor, "bulkhead-first-cancel", "pg_sleep(10)") == 1; });
    check_cancelled_at_once(source, call);
    CHECK(gate.available() == 1);
    CHECK(gate.stats().work_cancelled == 1);
}
