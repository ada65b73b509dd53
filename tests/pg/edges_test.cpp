// Contract E against a real PostgreSQL: stop, deadlines, cancellation, dead
// connections and session state, tried with the faults a real network and
// database make: a backend frozen mid-statement (SIGSTOP), a network that
// goes silent or holds new connections unanswered (tests/support/tcp_proxy),
// a backend killed a moment before a borrow, callbacks that leave session
// state behind or end the transaction themselves.
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "run_program.hpp"
#include "tcp_proxy.hpp"

#if BULKHEAD_HAVE_ASIO
#include "asio_support.hpp"
#endif

#include "catch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <latch>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#ifndef BULKHEAD_EXIT_PROBE_PATH
#define BULKHEAD_EXIT_PROBE_PATH ""
#endif

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

namespace {

/// The backend pid of the connection `gate` lends, read in one transaction.
template <class Gate>
int backend_through(Gate& gate) {
    return gate.transaction(1s, [](pqxx::dbtransaction& tx) { return tx.conn().backendpid(); });
}

/// Milliseconds since `start`, for INFO lines and bounds.
long ms_since(clock_type::time_point start) {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count());
}

/// Prints "edges: <what> <ms> ms after it" (the figures of docs/deadlines.md;
/// .ci/run collects the lines).
void figure(const char* what, clock_type::time_point since) {
    std::printf("edges: %s %ld ms after it\n", what, ms_since(since));
    std::fflush(stdout);
}

/// The first column of the first row, as text, from a gate transaction.
std::string value_of(pqxx::dbtransaction& tx, const std::string& sql) { return tx.exec(sql).at(0).at(0).c_str(); }

/// Waits until a session of `application_name` runs a statement whose text
/// holds `text` (state 'active'; the statement itself, not a BEGIN before it,
/// which a stop would end before the callback starts).
void await_running(pqxx::connection& monitor, const std::string& application_name, const std::string& text) {
    await([&] { return running(monitor, application_name, text) > 0; });
}

}  // namespace

// --- E1 ---------------------------------------------------------------------------
TEST_CASE(
    "[E1] a stop while waiting for a pool connection ends the call with admission_cancelled at once, nothing sent",
    "[pg][E1]") {
    tcp_proxy proxy = proxy_to_server();
    auto options = proxied_options(proxy, "bulkhead-e1");
    options.connection_timeout = 3s;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 2, 0);
    SECTION("all connections held elsewhere") {
        bulkhead::pqxx_pool::lease taken = pool.acquire();  // the only connection, outside the gate
        const int queries_before = proxy.queries();
        std::stop_source stop;
        bool ran = false;
        auto call = std::async(std::launch::async, [&] {
            gate.transaction({.queue_wait = 1s, .stop = stop.get_token()}, [&](pqxx::dbtransaction&) { ran = true; });
        });
        await([&] { return pool.waiting() == 1; });
        const auto stopped_at = clock_type::now();
        stop.request_stop();
        CHECK_THROWS_AS(call.get(), bulkhead::admission_cancelled);
        figure("E1 stop while all connections are held: returned", stopped_at);
        CHECK(clock_type::now() - stopped_at < 500ms);  // the pool's timeout is 3 s
        CHECK_FALSE(ran);
        CHECK(proxy.queries() == queries_before);  // nothing reached the server
        CHECK(pool.waiting() == 0);
    }
    SECTION("a new connection being opened, its server not answering") {
        proxy.hold_new(true);  // connects are accepted and never answered
        std::stop_source stop;
        bool ran = false;
        auto call = std::async(std::launch::async, [&] {
            gate.transaction({.queue_wait = 1s, .stop = stop.get_token()}, [&](pqxx::dbtransaction&) { ran = true; });
        });
        await([&] { return proxy.held() == 1; });
        const auto stopped_at = clock_type::now();
        stop.request_stop();
        CHECK_THROWS_AS(call.get(), bulkhead::admission_cancelled);
        figure("E1 stop while a connect is unanswered: returned", stopped_at);
        CHECK(clock_type::now() - stopped_at < 500ms);
        CHECK_FALSE(ran);
    }
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 2);
    CHECK(gate.stats().rejections(bulkhead::reject_reason::admission_cancelled) == 1);
}

// --- E2 ---------------------------------------------------------------------------
// [direct]: freezes the backend by its pid (SIGSTOP); through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[E2] the check of an idle connection and the opening of its replacement end by the deadline",
          "[pg][E2][direct]") {
    auto monitor = outside_connection();
    SECTION("the idle connection's backend is frozen: validation gives up at the deadline") {
        auto options = pool_options("bulkhead-e2-frozen", 1);
        options.validate_after_idle = 0ms;  // check on every borrow
        options.validation_timeout = 5s;
        options.connection_timeout = 5s;
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        const int pid = backend_through(gate);
        frozen_backend frozen(pid);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(gate.transaction({.deadline = start + 200ms}, [](pqxx::dbtransaction&) {}), bulkhead::rejected);
        figure("E2 idle connection's backend frozen, deadline 200 ms: ended", start);
        CHECK(clock_type::now() - start < 700ms);  // was 5 s (validation_timeout), then 2 s of connect
        frozen.thaw();
        CHECK(gate.available() == 1);
    }
    SECTION("the replacement connect is never answered: the acquire ends by the deadline") {
        tcp_proxy proxy = proxy_to_server();
        auto options = proxied_options(proxy, "bulkhead-e2-connect");
        options.connection_timeout = 5s;
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        proxy.hold_new(true);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(gate.transaction({.deadline = start + 300ms}, [](pqxx::dbtransaction&) {}),
                        bulkhead::deadline_exceeded);
        figure("E2 replacement connect unanswered, deadline 300 ms: ended", start);
        CHECK(clock_type::now() - start < 800ms);  // libpq's connect_timeout alone: at least 2 s
        // Without a deadline, connection_timeout bounds it the same way.
        auto short_options = proxied_options(proxy, "bulkhead-e2-connect-timeout");
        short_options.connection_timeout = 300ms;
        short_options.max_size = 4;
        bulkhead::pqxx_pool short_pool(short_options);
        const int held_before = proxy.held();
        const auto again = clock_type::now();
        CHECK_THROWS_AS(short_pool.acquire(), bulkhead::pool_timeout);
        CHECK(clock_type::now() - again < 800ms);
        // One caller that timed out started one attempt, which keeps its slot
        // until it ends; it did not go on to fill the pool with more.
        CHECK(short_pool.size() == 1);
        CHECK(proxy.held() - held_before == 1);
    }
}

TEST_CASE("[E2] a process that exits while a connection attempt it gave up on runs waits for it, up to its timeout",
          "[pg][E2]") {
    // The attempt runs inside libpq on a thread nobody joins; an exit under
    // it would tear down libpq's libraries (libgssapi's mutexes) while it
    // uses them. tests/pg/exit_probe.cpp gives up on a connect that is never
    // answered and returns from main at once.
    const std::string probe = BULKHEAD_EXIT_PROBE_PATH;
    REQUIRE_FALSE(probe.empty());
    const auto start = clock_type::now();
    const program_result run = run_program(probe, "2>&1");  // a sanitizer's report shows in the output
    figure("E2 exit with an unanswered connect in flight (libpq's connect_timeout=2): took", start);
    CHECK(run.output == "acquire: pool_timeout\nrunning at exit: 0\n");
    CHECK(run.exited_zero());
    const auto took = clock_type::now() - start;
    // It waited for the attempt, not raced it (that exit took about 100 ms).
    // libpq before 17 counts connect_timeout=2 in whole seconds of time()
    // from each wait's start, so the attempt lasts from just over 1 s to 3 s.
    CHECK(took >= 900ms);
    CHECK(took < 5s);  // nor longer than the attempt's own bound: 2 s of connect_timeout (up to 3 s in
                       // libpq before 17, which counts whole seconds of time()), 1 s after it
}

// --- E3 ---------------------------------------------------------------------------
TEST_CASE("[E3] a statement of the callback that ends the transaction block fails the call, nothing after it runs",
          "[pg][E3]") {
    scratch_table table("bulkhead_e3", "id int");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-e3", 1));
    gate_t gate(pool, 1, 0);
    const std::string insert = "INSERT INTO " + table.name() + " VALUES ";
    SECTION("COMMIT in the middle") {
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](pqxx::dbtransaction& tx) {
                                             tx.exec(insert + "(1)");
                                             tx.exec("COMMIT");  // commits (1): the server did what it was told
                                             tx.exec(insert + "(2)");
                                         }),
                        std::logic_error);
        CHECK(table.rows("id = 2") == 0);  // nothing after the COMMIT reached the server
    }
    SECTION("ROLLBACK, then a statement that would autocommit") {
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](pqxx::dbtransaction& tx) {
                                             tx.exec(insert + "(1)");
                                             tx.exec("ROLLBACK");
                                             tx.exec(insert + "(2)");
                                         }),
                        std::logic_error);
        CHECK(table.rows() == 0);
    }
    SECTION("the callback swallows the failure and returns normally") {
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](pqxx::dbtransaction& tx) {
                                             tx.exec("END");
                                             try {
                                                 tx.exec(insert + "(3)");
                                             } catch (...) {  // swallowed: the gate must still fail the call
                                             }
                                             return 1;
                                         }),
                        std::logic_error);
        CHECK(table.rows() == 0);
    }
    SECTION("a COMMIT of the callback's that fails (a deferred constraint), then a statement") {
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](pqxx::dbtransaction& tx) {
                                             tx.exec(
                                                 "CREATE TEMP TABLE bulkhead_e3_once (id int UNIQUE DEFERRABLE "
                                                 "INITIALLY DEFERRED) ON COMMIT DROP");
                                             tx.exec("INSERT INTO bulkhead_e3_once VALUES (1), (1)");
                                             try {
                                                 tx.exec("COMMIT");  // fails at the check: the block is over
                                             } catch (const pqxx::sql_error&) {
                                             }
                                             tx.exec(insert + "(4)");
                                         }),
                        std::logic_error);
#if PQXX_VERSION_MAJOR == 6
        CHECK(table.rows() == 0);  // libpqxx 6: stopped before it was sent
#else
        // libpqxx 7 has no hook before a statement, and the failed COMMIT's
        // error result says nothing the guard can tell from a failed
        // statement: the INSERT ran outside the transaction. The call still
        // fails (docs/pqxx_pool.md states this limit).
        CHECK(table.rows() <= 1);
#endif
    }
    CHECK(gate.stats().completed == 0);
    CHECK(gate.stats().failed == 1);
    CHECK(gate.available() == 1);
    CHECK(pool.in_use() == 0);
    // Savepoints are no false alarm, and the pool recovers.
    CHECK(gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        tx.exec("SAVEPOINT a");
        tx.exec(insert + "(10)");
        tx.exec("ROLLBACK TO SAVEPOINT a");
        tx.exec("RELEASE SAVEPOINT a");
        tx.exec(insert + "(11)");
        return 5;
    }) == 5);
    CHECK(table.rows("id = 11") == 1);
    CHECK(table.rows("id = 10") == 0);
}

// --- E5 ---------------------------------------------------------------------------
TEST_CASE("[E5] request_stop returns at once when the cancel cannot get through, and the connection is not reused",
          "[pg][E5]") {
    tcp_proxy proxy = proxy_to_server();
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-e5"));
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int first = backend_through(gate);
    proxy.hold_new(true);  // the cancel's own connection is accepted and never answered
    std::stop_source stop;
    gate_t::options call{.stop = stop.get_token()};
    auto running = std::async(std::launch::async, [&] {
        gate.transaction(call, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.6)"); });
    });
    await_running(monitor, "bulkhead-e5", "pg_sleep(0.6)");
    const auto before = clock_type::now();
    stop.request_stop();
    const auto took = clock_type::now() - before;
    std::printf("edges: E5 request_stop with an unanswered cancel took %ld us\n",
                static_cast<long>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()));
    // Microseconds as a rule (one thread started); the bound leaves room for a
    // sanitizer build on a loaded machine. Was: blocked until the cancel was
    // answered (5 s here, a TCP timeout in general).
    CHECK(took < 200ms);
    // The watchdog cuts the connection at the stop plus deadline_slack ([E15]); nothing committed.
    CHECK_THROWS_AS(running.get(), bulkhead::work_cancelled);
    CHECK(proxy.held() == 1);  // the cancel really was sent, and is still stuck
    CHECK(gate.available() == 1);
    proxy.hold_new(false);
    const int next = backend_through(gate);
    CHECK(next != first);  // a cancel still in flight: the connection was closed, not handed on
}

// --- E6 ---------------------------------------------------------------------------
TEST_CASE("[E6] a cancel never hits a statement other than the one it was sent for", "[pg][E6]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-e6", 1));
    gate_t gate(pool, 1, 0);
    // The next borrower's statement: a late cancel would fail it with 57014.
    const random_stops counted = stop_at_random_moments(gate, 6, 150, [&] {
        return sqlstate_of(
            [&] { gate.transaction(1s, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.002)"); }); });
    });
    INFO(counted.cancelled << " cancelled, " << counted.completed << " completed");
    CHECK(counted.hit_next == 0);
    CHECK(counted.cancelled > 0);
    CHECK(gate.available() == 1);
    CHECK(pool.in_use() == 0);
}

// --- E7 ---------------------------------------------------------------------------
// [direct]: freezes the backend by its pid (SIGSTOP); through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[E7] with a deadline the call ends within deadline + slack when the server or the network goes silent",
          "[pg][E7][direct]") {
    auto options = pool_options("bulkhead-e7", 1);
    options.deadline_slack = 250ms;
    SECTION("the backend is frozen mid-transaction") {
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        std::optional<frozen_backend> frozen;
        const auto start = clock_type::now();
        try {
            gate.transaction({.deadline = start + 500ms}, [&](pqxx::dbtransaction& tx) {
                frozen.emplace(tx.conn().backendpid());
                tx.exec("SELECT 1");  // never answered
            });
            FAIL("a frozen server answered");
        } catch (const bulkhead::work_deadline_exceeded&) {
        }
        const auto took = clock_type::now() - start;
        figure("E7 backend frozen mid-statement, deadline 500 ms, slack 250 ms: ended", start);
        CHECK(took >= 500ms);
        CHECK(took < 500ms + 250ms + 400ms);
        frozen.reset();
        CHECK(pool.in_use() == 0);
        CHECK(pool.size() == 0);  // discarded
        CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return value_of(tx, "SELECT 7"); }) == "7");
    }
    SECTION("the backend is frozen during COMMIT: the outcome is unknown, and the message names the watchdog") {
        // The callback wrote and returned; its backend freezes before the
        // COMMIT arrives. The watchdog cuts the connection at deadline +
        // slack, and the transaction is still open on the frozen backend, so
        // its outcome cannot be read: libpq then says the server closed the
        // connection, which it did not.
        scratch_table table("bulkhead_e7_commit", "id int");
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        std::optional<frozen_backend> frozen;
        const auto start = clock_type::now();
        const std::string message = message_of<bulkhead::commit_unknown>([&] {
            gate.transaction({.deadline = start + 500ms}, [&](pqxx::dbtransaction& tx) {
                exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
                frozen.emplace(tx.conn().backendpid());
            });
        });
        CHECK(clock_type::now() - start < 500ms + 250ms + 400ms);
        CHECK_THAT(message, Catch::Matchers::ContainsSubstring("the pool's watchdog shut it down"));
        frozen.reset();
        CHECK(pool.in_use() == 0);
        CHECK(pool.size() == 0);  // discarded
    }
    SECTION("the network stops forwarding mid-statement") {
        tcp_proxy proxy = proxy_to_server();
        auto proxied = proxied_options(proxy, "bulkhead-e7-silent");
        proxied.deadline_slack = 250ms;
        bulkhead::pqxx_pool pool(proxied);
        gate_t gate(pool, 1, 0);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(gate.transaction({.deadline = start + 400ms},
                                         [&](pqxx::dbtransaction& tx) {
                                             proxy.silence(true);
                                             tx.exec("SELECT 1");
                                         }),
                        bulkhead::work_deadline_exceeded);
        figure("E7 network silent mid-statement, deadline 400 ms, slack 250 ms: ended", start);
        CHECK(clock_type::now() - start < 400ms + 250ms + 400ms);
        proxy.silence(false);
        CHECK(pool.size() == 0);
    }
}

namespace {

/// A call whose BEGIN goes unanswered, the backend frozen or the network
/// silent, ends within deadline + slack with `Expected`, its connection
/// discarded and its permit back. `work` is the callback, which must not
/// return.
template <class Expected, class Work>
void check_unanswered_begin(const Work& work, const std::string& name) {
    gate_t::options call{};
    SECTION("the backend is frozen before the BEGIN") {
        auto options = pool_options(name, 1);
        options.deadline_slack = 250ms;
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        const int pid = backend_through(gate);
        frozen_backend frozen(pid);
        const auto start = clock_type::now();
        call.deadline = start + 500ms;
        CHECK_THROWS_AS(gate.transaction(call, work), Expected);
        const auto took = clock_type::now() - start;
        CHECK(took >= 500ms);
        CHECK(took < 500ms + 250ms + 400ms);
        frozen.thaw();
        CHECK(pool.size() == 0);  // discarded
        CHECK(gate.available() == 1);
    }
    SECTION("the network stops forwarding") {
        proxied_gate s(name + "-silent", 250ms);
        (void)backend_through(s.gate);
        s.proxy.silence(true);
        const auto start = clock_type::now();
        call.deadline = start + 400ms;
        CHECK_THROWS_AS(s.gate.transaction(call, work), Expected);
        CHECK(clock_type::now() - start < 400ms + 250ms + 400ms);
        s.proxy.silence(false);
        CHECK(s.pool.size() == 0);
        CHECK(s.gate.available() == 1);
    }
}

const auto never_runs = [](pqxx::dbtransaction&) { FAIL("the callback ran"); };

}  // namespace

// [direct]: freezes the backend by its pid (SIGSTOP); through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[E7] a first statement that carries its deferred BEGIN (pqxx_transaction&) whose server or network goes silent "
    "ends within deadline + slack",
    "[pg][E7][J1][direct]") {
    // BEGIN goes out with the callback's first statement, which may have
    // run: reported as the work's deadline.
    const auto first_never_answered = [](bulkhead::pqxx_transaction& tx) {
        (void)tx.exec("SELECT 1");
        FAIL("the first statement was answered");
    };
    check_unanswered_begin<bulkhead::work_deadline_exceeded>(first_never_answered, "bulkhead-e7-deferred");
}

TEST_CASE("[E7] a plain BEGIN whose server or network goes silent ends within deadline + slack, before the work",
          "[pg][E7][direct]") {
    // Nothing of the caller's ran: a rejection before the work, as a deadline
    // that passes while the call waits for its connection.
    check_unanswered_begin<bulkhead::deadline_exceeded>(never_runs, "bulkhead-e7-begin");
}

// --- E8 ---------------------------------------------------------------------------
// [direct]: on_connect's search_path and prepared statement belong to the server connection on_connect ran on;
// through PgBouncer the next call may run on another (see the [pgbouncer] on_connect and prepared-statement
// cases; [H8] is the reset through PgBouncer); left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[E8] the next borrower never sees the previous one's session state, and on_connect's survives",
          "[pg][E8][direct]") {
    auto options = pool_options("bulkhead-e8", 1);
    options.on_connect = [](pqxx::connection& connection) {
        pqxx::nontransaction setup(connection);
        setup.exec("SET search_path = bulkhead_e8, public");
        setup.exec("PREPARE bulkhead_e8_one AS SELECT 1");
    };
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    const int pid = gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        tx.exec("SET statement_timeout = 50");
        tx.exec("SET search_path = public");
        tx.exec("SELECT set_config('work_mem', '7MB', false)");
        tx.exec("SELECT pg_advisory_lock(4242)");
        tx.exec("LISTEN bulkhead_e8");
        tx.exec("DECLARE bulkhead_e8_cursor CURSOR WITH HOLD FOR SELECT 1");
        tx.exec("CREATE TEMP TABLE bulkhead_e8_temp (x int)");
        return tx.conn().backendpid();
    });
    const auto seen = gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        std::vector<std::string> values;
        values.push_back(std::to_string(tx.conn().backendpid()));
        values.push_back(value_of(tx, "SHOW statement_timeout"));
        values.push_back(value_of(tx, "SHOW work_mem"));
        values.push_back(
            value_of(tx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"));
        values.push_back(value_of(tx, "SELECT count(*) FROM pg_listening_channels()"));
        values.push_back(value_of(tx, "SELECT count(*) FROM pg_cursors"));
        values.push_back(value_of(tx, "SELECT coalesce(to_regclass('pg_temp.bulkhead_e8_temp')::text, 'none')"));
        values.push_back(value_of(tx, "SHOW search_path"));
        values.push_back(value_of(tx, "SELECT count(*) FROM pg_prepared_statements WHERE name = 'bulkhead_e8_one'"));
        tx.exec("SELECT pg_sleep(0.1)");  // would fail with 57014 under the leaked statement_timeout
        return values;
    });
    REQUIRE(seen.size() == 9);
    CHECK(seen[0] == std::to_string(pid));  // the same session, reset
    CHECK(seen[1] == "0");
    CHECK(seen[2] == scalar<std::string>(*std::make_unique<pqxx::connection>(conninfo()), "SHOW work_mem"));
    CHECK(seen[3] == "0");
    CHECK(seen[4] == "0");
    CHECK(seen[5] == "0");
    CHECK(seen[6] == "none");
    CHECK(seen[7] == "bulkhead_e8, public");  // on_connect's setting survives
    CHECK(seen[8] == "1");                    // and its prepared statement
    // A connection used directly gets the same reset when it comes back.
    {
        bulkhead::pqxx_pool::lease raw = pool.acquire();
        pqxx::nontransaction tx(raw.connection());
        tx.exec("SET statement_timeout = 50");
        tx.exec("SELECT pg_advisory_lock(4343)");
    }
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        tx.exec("SELECT pg_sleep(0.1)");
        return value_of(tx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()");
    }) == "0");
    CHECK(pool.size() == 1);
    // A rolled-back transaction is reset too.
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [](pqxx::dbtransaction& tx) {
                                         tx.exec("SET statement_timeout = 50");
                                         throw std::runtime_error("the callback fails");
                                     }),
                    std::runtime_error);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return value_of(tx, "SHOW statement_timeout"); }) == "0");
}

// --- E9 ---------------------------------------------------------------------------
// [direct]: terminates the pool connection's backend by its pid; through PgBouncer there is no backend of the
// pool's own to kill; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[E9] a backend killed a moment before the borrow is found out with default options, no error reaches the caller",
    "[pg][E9][C7][direct]") {
    bulkhead::pqxx_pool_options options = pool_options("bulkhead-e9", 1);
    options.validate_after_idle = bulkhead::pqxx_pool_options{}.validate_after_idle;  // the default, 500 ms
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    for (int round = 0; round < 5; ++round) {
        const int pid = backend_through(gate);
        terminate_backend(monitor, pid);  // returns once the backend is gone: well under 500 ms of idleness
        const int next = backend_through(gate);
        CHECK(next != pid);
    }
    // Found out on borrow (broken, or told something and then checked), not
    // by a BEGIN that failed (that connection would count as discarded).
    const bulkhead::pool_stats stats = pool.stats();
    CHECK(stats.closed_for(bulkhead::close_reason::broken) +
              stats.closed_for(bulkhead::close_reason::validation_failed) ==
          5);
    CHECK(stats.closed_for(bulkhead::close_reason::discarded) == 0);
}

TEST_CASE("[E9] a BEGIN that fails on a broken connection is tried once more on another connection", "[pg][E9]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_e9_begin", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-e9-begin"));
    gate_t gate(pool, 1, 0);
    const int first = backend_through(gate);
    proxy.arm(tcp_proxy::cut::drop_at_next_query);  // the next BEGIN finds the connection broken
    const int second = gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        tx.exec("INSERT INTO " + table.name() + " VALUES (1)");
        return tx.conn().backendpid();
    });
    CHECK(proxy.cuts() == 1);
    CHECK(second != first);
    CHECK(table.rows() == 1);
    CHECK(gate.stats().completed == 2);
}

// --- E10 --------------------------------------------------------------------------
TEST_CASE("[E10] two statements that together overrun the deadline are rolled back, not committed late", "[pg][E10]") {
    scratch_table table("bulkhead_e10", "id int");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-e10", 1));
    gate_t gate(pool, 1, 0);
    const auto start = clock_type::now();
    CHECK_THROWS_AS(gate.transaction({.deadline = start + 300ms},
                                     [&](pqxx::dbtransaction& tx) {
                                         tx.exec("INSERT INTO " + table.name() + " VALUES (1)");
                                         tx.exec("SELECT pg_sleep(0.2)");
                                         tx.exec("SELECT pg_sleep(0.2)");  // each under its statement_timeout
                                     }),
                    bulkhead::work_deadline_exceeded);
    CHECK(table.rows() == 0);
    CHECK(gate.stats().work_deadline_exceeded == 1);
    CHECK(pool.size() == 1);  // rolled back cleanly, kept
}

// --- E11 --------------------------------------------------------------------------
TEST_CASE("[E11] no password, nor a piece of one, reaches a pool's message, in URI or keyword form", "[pg][E11]") {
    std::mt19937 random(11);
    std::uniform_int_distribution<int> printable(0x21, 0x7e);
    const auto leaks = [](const std::string& text, const std::string& password) {
        for (std::size_t at = 0; at + 4 <= password.size(); ++at) {
            if (text.find(password.substr(at, 4)) != std::string::npos) {
                return true;
            }
        }
        return false;
    };
    int messages = 0;
    for (int i = 0; i < 20; ++i) {
        std::string password;
        for (int c = 0; c < 12; ++c) {
            password += static_cast<char>(printable(random));
        }
        // Nothing listens on port 1: every attempt fails at once, with libpq's message.
        const std::vector<std::string> forms{
            "host=127.0.0.1 port=1 user=app dbname=shop password=" + bulkhead::detail::quote_keyword_value(password),
            "postgresql://app:" + bulkhead::detail::percent_encode(password) + "@127.0.0.1:1/shop",
            "postgresql://app:" + password + "@127.0.0.1:1/shop",  // unencoded
            "host=127.0.0.1 port=1 password=" + password + " x",   // unquoted, spilling
        };
        for (const std::string& conninfo : forms) {
            std::string message;
            try {
                bulkhead::pqxx_pool pool({.conninfo = conninfo, .connection_timeout = 250ms});
                (void)pool.acquire(clock_type::now() + 50ms);
            } catch (const std::exception& failure) {
                message = failure.what();
            }
            INFO(message);
            CHECK_FALSE(message.empty());
            CHECK_FALSE(leaks(message, password));
            ++messages;
        }
    }
    CHECK(messages == 80);
}

// --- E12 --------------------------------------------------------------------------
TEST_CASE("[E12] settling a lost COMMIT never takes the pool past max_size connections", "[pg][E12]") {
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_e12", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-e12"));  // max_size 1
    gate_t gate(pool, 1, 0);
    int most = 0;
    for (int round = 0; round < 3; ++round) {
        // The proxy notices a client's close on its own threads, a moment
        // later: the count starts once the last round's sockets are gone.
        await([&] { return proxy.open_links() == 0; });
        proxy.reset_max_open_links();
        proxy.arm(tcp_proxy::cut::drop_after_commit);
        CHECK(gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            tx.exec("INSERT INTO " + table.name() + " VALUES (1)");
            return 1;
        }) == 1);  // settled: committed
        most = std::max(most, proxy.max_open_links());
    }
    CHECK(proxy.cuts() == 3);
    CHECK(most == 1);  // the lookup's connection counts against max_size: the lost one was closed first
    CHECK(table.rows() == 3);
}

// --- E13 --------------------------------------------------------------------------
// [direct]: cancels the call's backend by its pid as a DBA would (pg_cancel_backend); through PgBouncer the
// client's pid is one PgBouncer made up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[E13] only the deadline's own timeout is blamed on the deadline", "[pg][E13][direct]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-e13", 1));
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    SECTION("the callback's own SET LOCAL statement_timeout") {
        const std::string state = sqlstate_of([&] {
            gate.transaction({.deadline = clock_type::now() + 5s}, [](pqxx::dbtransaction& tx) {
                tx.exec("SET LOCAL statement_timeout = 50");
                tx.exec("SELECT pg_sleep(1)");
            });
        });
        CHECK(state == "57014");  // a plain sql_error, not work_deadline_exceeded
    }
    SECTION("a DBA's pg_cancel_backend") {
        std::atomic<int> pid{0};
        auto call = std::async(std::launch::async, [&] {
            return sqlstate_of([&] {
                gate.transaction({.deadline = clock_type::now() + 5s}, [&](pqxx::dbtransaction& tx) {
                    pid = tx.conn().backendpid();
                    tx.exec("SELECT pg_sleep(3)");
                });
            });
        });
        await([&] { return pid.load() != 0 && sessions(monitor, "bulkhead-e13", "active") > 0; });
        pqxx::nontransaction(monitor).exec("SELECT pg_cancel_backend(" + std::to_string(pid.load()) + ")");
        CHECK(call.get() == "57014");
    }
    SECTION("the deadline's own") {
        CHECK_THROWS_AS(gate.transaction({.deadline = clock_type::now() + 200ms},
                                         [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(2)"); }),
                        bulkhead::work_deadline_exceeded);
    }
    CHECK(gate.available() == 1);
}

TEST_CASE("[E8] with reset_session off the pool leaves the session as the callback left it", "[pg][E8]") {
    auto options = pool_options("bulkhead-e8-off", 1);
    options.reset_session = false;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    gate.transaction(1s, [](pqxx::dbtransaction& tx) { tx.exec("SET statement_timeout = 50"); });
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return value_of(tx, "SHOW statement_timeout"); }) ==
          "50ms");
}

// --- E15 --------------------------------------------------------------------------
namespace {

/// Who makes [E15]'s call: a thread (transaction) or an Asio caller
/// (async_transaction, the work on the gate's work thread).
enum class e15_caller : std::uint8_t { thread, asio };

/// [E15]: a call that wrote a row and then sleeps 5 s on the server, through
/// a proxy that lets sessions through but holds every cancel request
/// unanswered (a pooler or load balancer that drops cancels), is stopped
/// while the sleep runs. It ends with work_cancelled within the slack of
/// the stop, long before the sleep would; the permit is back, the connection
/// was discarded, the next call gets a new backend, and the row was never
/// committed.
void check_unanswered_cancel(e15_caller caller, bool with_deadline) {
    constexpr auto slack = 250ms;
    const std::string name = "bulkhead-e15";
    scratch_table table("bulkhead_e15", "id int");
    tcp_proxy proxy = proxy_to_server();
    auto options = proxied_options(proxy, name);
    options.deadline_slack = slack;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int first = backend_through(gate);
    proxy.hold_cancels(true);
    std::stop_source stop;
    gate_t::options call{.stop = stop.get_token()};
    if (with_deadline) {
        call.deadline = clock_type::now() + 30s;  // far: only the stop can end the call early
    }
    const auto work = [&table](pqxx::dbtransaction& tx) {
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
        tx.exec("SELECT pg_sleep(5)");
        return 0;
    };
    // How the call ended: its exception, and for an Asio caller (the
    // failure overload, its completion run on `io`) its error code.
    std::future<void> ended;
    std::exception_ptr failure;
    std::error_code code;
#if BULKHEAD_HAVE_ASIO
    std::promise<void> completed;
    std::optional<io_thread> io;
    if (caller == e15_caller::asio) {
        io.emplace();
        ended = completed.get_future();
        asio::post(io->executor(), [&] {
            gate.async_transaction(call, work, failure,
                                   asio::bind_executor(io->executor(), [&](std::error_code ec, int) {
                                       code = ec;
                                       completed.set_value();
                                   }));
        });
    }
#endif
    if (caller == e15_caller::thread) {
        ended = std::async(std::launch::async, [&] {
            try {
                (void)gate.transaction(call, work);
            } catch (...) {
                failure = std::current_exception();
            }
        });
    }
    await_running(monitor, name, "pg_sleep(5)");
    const auto stopped_at = clock_type::now();
    stop.request_stop();
    CHECK(clock_type::now() - stopped_at < 200ms);  // never blocks on the held cancel
    REQUIRE(ended.wait_for(10s) == std::future_status::ready);
    const auto took = clock_type::now() - stopped_at;
    figure(caller == e15_caller::thread ? "E15 stop with its cancel held, slack 250 ms: the call ended"
                                        : "E15 stop of an Asio caller with its cancel held, slack 250 ms: ended",
           stopped_at);
    ended.get();
    if (caller == e15_caller::asio) {
        CHECK(code == bulkhead::work_error::work_cancelled);
    }
    REQUIRE(failure);
    try {
        std::rethrow_exception(failure);
    } catch (const bulkhead::work_cancelled& cancelled) {
        // The cut, not the server's 57014: the cancel never arrived.
        CHECK_THROWS_AS(std::rethrow_if_nested(cancelled), pqxx::broken_connection);
    } catch (...) {
        FAIL("the call ended otherwise than with work_cancelled");
    }
    CHECK(took >= slack - 50ms);       // the cut waits out the slack for the cancel
    CHECK(took < slack + 1s);          // and then ends the call, long before the 5 s sleep
    CHECK(proxy.held_cancels() == 1);  // the cancel really was sent, and is still unanswered
    CHECK(gate.available() == 1);
    CHECK(gate.stats().work_cancelled == 1);
    CHECK(pool.in_use() == 0);
    CHECK(pool.size() == 0);  // discarded, never put back
    CHECK(pool.stats().closed_for(bulkhead::close_reason::discarded) == 1);
    const int next = backend_through(gate);  // the next call is served, on a new connection
    CHECK(next != first);
    // The cut backend sleeps on inside its transaction until it tries to
    // answer; ended here, its transaction is final: never committed.
    terminate_backend(monitor, first);
    CHECK(table.rows() == 0);
}

}  // namespace

// [direct]: reads and terminates the backend by its pid; through PgBouncer the client's pid is one PgBouncer made
// up; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[E15] a stop whose cancel goes unanswered ends the call with work_cancelled within deadline_slack, and its "
    "connection is discarded",
    "[pg][E15][direct]") {
    SECTION("a thread's call without a deadline") { check_unanswered_cancel(e15_caller::thread, false); }
    SECTION("a thread's call with a deadline") { check_unanswered_cancel(e15_caller::thread, true); }
#if BULKHEAD_HAVE_ASIO
    SECTION("an Asio caller's call without a deadline") { check_unanswered_cancel(e15_caller::asio, false); }
    SECTION("an Asio caller's call with a deadline") { check_unanswered_cancel(e15_caller::asio, true); }
#endif
}

// [direct]: compares backend pids; through PgBouncer the client's pid is one PgBouncer made up; left out of the
// pgbouncer pass (docs/pgbouncer.md).
TEST_CASE(
    "[E15] a stop whose cancel is answered ends the call as before (57014), and its connection is kept and never "
    "cut later",
    "[pg][E15][direct]") {
    const bool with_deadline = GENERATE(false, true);
    const std::string name = "bulkhead-e15-answered";
    auto options = pool_options(name, 1);
    options.deadline_slack = 250ms;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int first = backend_through(gate);
    std::stop_source stop;
    gate_t::options call{.stop = stop.get_token()};
    if (with_deadline) {
        call.deadline = clock_type::now() + 30s;
    }
    auto running = std::async(std::launch::async, [&] {
        gate.transaction(call, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(5)"); });
    });
    await_running(monitor, name, "pg_sleep(5)");
    check_cancelled_at_once(stop, running);  // work_cancelled over the server's 57014, within a second
    CHECK(gate.available() == 1);
    CHECK(pool.size() == 1);  // kept
    CHECK(pool.idle() == 1);
    // The stop's cut was disarmed with the transaction: on the same
    // connection, a statement that outlasts the slack is not cut off.
    gate_t::options again{};
    if (with_deadline) {
        again.deadline = clock_type::now() + 30s;
    }
    const int next = gate.transaction(again, [](pqxx::dbtransaction& tx) {
        tx.exec("SELECT pg_sleep(0.5)");
        return tx.conn().backendpid();
    });
    CHECK(next == first);
    const bulkhead::pool_stats stats = pool.stats();
    std::uint64_t closed = 0;
    for (const std::uint64_t each : stats.closed) {
        closed += each;
    }
    CHECK(closed == 0);
    CHECK(stats.opened == 1);
}

namespace {

/// A gate of one permit over a pool of one through a proxy, its connection
/// open; then the proxy holds cancel requests and every byte, so that a
/// call's BEGIN is the first thing the silence holds.
struct silent_begin {
    silent_begin(const std::string& application_name, std::chrono::milliseconds slack)
        : proxy(proxy_to_server()), pool(options(proxy, application_name, slack)), gate(pool, 1, 0) {
        (void)backend_through(gate);
        proxy.hold_cancels(true);
        proxy.silence(true);  // the open session's bytes wait in the proxy
    }

    static bulkhead::pqxx_pool_options options(tcp_proxy& proxy, const std::string& application_name,
                                               std::chrono::milliseconds slack) {
        auto options = proxied_options(proxy, application_name);
        options.deadline_slack = slack;
        options.validate_after_idle = 1h;  // the borrow sends nothing
        return options;
    }

    tcp_proxy proxy;
    bulkhead::pqxx_pool pool;
    gate_t gate;
};

}  // namespace

TEST_CASE(
    "[E15] a stop during a BEGIN that goes unanswered, its cancel held too, ends the call with work_cancelled "
    "within deadline_slack, not retried on another connection",
    "[pg][E15]") {
    const bool with_deadline = GENERATE(false, true);
    constexpr auto slack = 250ms;
    silent_begin setup("bulkhead-e15-begin", slack);
    tcp_proxy& proxy = setup.proxy;
    bulkhead::pqxx_pool& pool = setup.pool;
    gate_t& gate = setup.gate;
    std::stop_source stop;
    gate_t::options call{.stop = stop.get_token()};
    if (with_deadline) {
        call.deadline = clock_type::now() + 30s;
    }
    bool ran = false;
    const int queries_before = proxy.queries();
    auto running =
        std::async(std::launch::async, [&] { gate.transaction(call, [&](pqxx::dbtransaction&) { ran = true; }); });
    await([&] { return proxy.queries() == queries_before + 1; });  // the BEGIN, held
    const auto stopped_at = clock_type::now();
    stop.request_stop();
    CHECK(clock_type::now() - stopped_at < 200ms);
    REQUIRE(running.wait_for(10s) == std::future_status::ready);
    const auto took = clock_type::now() - stopped_at;
    figure("E15 stop during an unanswered BEGIN with its cancel held, slack 250 ms: the call ended", stopped_at);
    // Cut off for the stop: work_cancelled, not the deadline's rejection, and
    // not tried again on a new connection (which the silence would hold).
    CHECK_THROWS_AS(running.get(), bulkhead::work_cancelled);
    CHECK(took >= slack - 50ms);
    CHECK(took < slack + 1s);
    CHECK_FALSE(ran);
    CHECK(proxy.held_cancels() == 1);
    CHECK(pool.stats().opened == 1);
    CHECK(pool.size() == 0);  // discarded
    CHECK(gate.available() == 1);
    proxy.silence(false);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return value_of(tx, "SELECT 7"); }) == "7");
}

TEST_CASE("[E15] a stop during a BEGIN whose connection then breaks is not retried on another connection",
          "[pg][E15]") {
    // A failover: the stop's cancel is held, then the connection breaks
    // before the cut at the stop plus the slack. BEGIN fails at once; the
    // pool must not try it again on a new connection (nothing would cancel
    // that one), and the call ends work_cancelled, well before the slack.
    constexpr auto slack = 2s;
    silent_begin setup("bulkhead-e15-broken-begin", slack);
    tcp_proxy& proxy = setup.proxy;
    bulkhead::pqxx_pool& pool = setup.pool;
    gate_t& gate = setup.gate;
    std::stop_source stop;
    bool ran = false;
    const int queries_before = proxy.queries();
    auto running = std::async(std::launch::async, [&] {
        gate.transaction({.stop = stop.get_token()}, [&](pqxx::dbtransaction&) { ran = true; });
    });
    await([&] { return proxy.queries() == queries_before + 1; });  // the BEGIN, held
    const auto stopped_at = clock_type::now();
    stop.request_stop();
    await([&] { return proxy.held_cancels() == 1; });  // the cancel reached the proxy, and waits there
    proxy.sever();                                     // the connection breaks; the proxy refuses new ones from now on
    REQUIRE(running.wait_for(10s) == std::future_status::ready);
    const auto took = clock_type::now() - stopped_at;
    CHECK_THROWS_AS(running.get(), bulkhead::work_cancelled);
    CHECK(took < slack);
    CHECK_FALSE(ran);
    CHECK(pool.stats().opened == 1);  // no retry on a new connection
    CHECK(pool.stats().connect_failures == 0);
    CHECK(gate.available() == 1);
}
