// Contract H4-H8 through PgBouncer in transaction pooling mode: what holds
// when a gate's pool connects to PgBouncer (tests/support/pgbouncer_throwaway.sh,
// the `pgbouncer` CTest fixture) instead of the server, and what breaks,
// each with what a user sees. Every case here is tagged [pgbouncer] and runs
// only in the pgbouncer pass (tests/pg/CMakeLists.txt), where conninfo()
// names PgBouncer and server_conninfo() the server behind it.
//
// In transaction mode PgBouncer lends a client one of its server
// connections for one transaction, then gives it to whichever client asks
// next, and resets nothing in between (server_reset_query is empty). Its
// idle server connections are reused last-in first-out: a client that asks
// right after another finished gets that client's server connection. The
// cases that must see one client follow another on the same backend use the
// fixture's single-backend database (single_backend_conninfo(): a pool of one
// server connection), and check that they did by pg_backend_pid(), which
// names the server's backend (libpq's PQbackendPID through PgBouncer is a
// number PgBouncer made up for the client).
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"

#include "catch.hpp"

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

namespace {

/// A plain libpq client of its own: another application instance, or a
/// driver that speaks the protocol the way libpq does (named prepared
/// statements, LISTEN), without libpqxx in between.
class libpq_client {
public:
    explicit libpq_client(const std::string& conninfo) : m_connection(PQconnectdb(conninfo.c_str()), &PQfinish) {
        if (PQstatus(m_connection.get()) != CONNECTION_OK) {
            FAIL("libpq_client: cannot connect: " << PQerrorMessage(m_connection.get()));
        }
    }

    /// The answer to `sql` (one simple query), as it came: ok or an error.
    struct answer {
        bool ok = false;
        std::string value;     // first column of the last result's first row, when it has one
        std::string sqlstate;  // on error
        std::string message;   // on error
    };

    [[nodiscard]] answer query(const std::string& sql) { return read(PQexec(m_connection.get(), sql.c_str())); }

    /// The value of `sql`; fails the test on an error.
    [[nodiscard]] std::string value(const std::string& sql) {
        const answer got = query(sql);
        if (!got.ok) {
            FAIL("libpq_client: " << sql << " failed: " << got.message);
        }
        return got.value;
    }

    /// Every row of `sql`'s last result, each as its columns' text; fails the test on an error.
    [[nodiscard]] std::vector<std::vector<std::string>> rows(const std::string& sql) {
        std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(m_connection.get(), sql.c_str()), &PQclear);
        if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) {
            FAIL("libpq_client: " << sql << " failed: " << PQresultErrorMessage(result.get()));
        }
        std::vector<std::vector<std::string>> all;
        for (int row = 0; row < PQntuples(result.get()); ++row) {
            std::vector<std::string>& columns = all.emplace_back();
            for (int column = 0; column < PQnfields(result.get()); ++column) {
                columns.emplace_back(PQgetvalue(result.get(), row, column));
            }
        }
        return all;
    }

    /// A named prepared statement on the protocol level (Parse), as drivers prepare.
    [[nodiscard]] answer prepare(const std::string& name, const std::string& sql) {
        return read(PQprepare(m_connection.get(), name.c_str(), sql.c_str(), 0, nullptr));
    }

    /// Bind and Execute of the named prepared statement `name`, no parameters.
    [[nodiscard]] answer execute_prepared(const std::string& name) {
        return read(PQexecPrepared(m_connection.get(), name.c_str(), 0, nullptr, nullptr, nullptr, 0));
    }

    /// Notifications libpq has read so far (it reads them with every answer).
    [[nodiscard]] int notifications() {
        (void)PQconsumeInput(m_connection.get());
        int count = 0;
        while (PGnotify* notify = PQnotifies(m_connection.get())) {
            ++count;
            PQfreemem(notify);
        }
        return count;
    }

private:
    static answer read(PGresult* result) {
        answer got;
        const ExecStatusType status = PQresultStatus(result);
        got.ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
        if (got.ok && PQntuples(result) > 0 && PQnfields(result) > 0) {
            got.value = PQgetvalue(result, 0, 0);
        }
        if (!got.ok) {
            const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
            got.sqlstate = state == nullptr ? "" : state;
            got.message = PQresultErrorMessage(result);
        }
        PQclear(result);
        return got;
    }

    std::unique_ptr<PGconn, decltype(&PQfinish)> m_connection;
};

/// Fails the test unless the suite runs through PgBouncer: these cases only
/// mean something there (they never skip).
void require_pgbouncer() {
    if (!through_pgbouncer()) {
        FAIL("a [pgbouncer] test runs only in the pgbouncer pass (ctest -L pgbouncer), through PgBouncer");
    }
}

/// A direct connection to the server behind PgBouncer, for what only the
/// server can tell (pg_stat_activity).
pqxx::connection server_monitor() { return pqxx::connection(server_conninfo()); }

/// The session state that one client can leave on a server connection, as
/// the next client of that connection sees it.
struct session_view {
    std::string backend_pid;
    std::string statement_timeout;
    std::string work_mem;
    std::string advisory_locks;
    std::string cursors;
    std::string temp_table;
    std::string listening;
};

session_view view_session(libpq_client& client) {
    return session_view{
        .backend_pid = client.value("SELECT pg_backend_pid()"),
        .statement_timeout = client.value("SHOW statement_timeout"),
        .work_mem = client.value("SHOW work_mem"),
        .advisory_locks =
            client.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"),
        .cursors = client.value("SELECT count(*) FROM pg_cursors"),
        .temp_table = client.value("SELECT coalesce(to_regclass('pg_temp.bulkhead_pgb_temp')::text, 'none')"),
        .listening = client.value("SELECT count(*) FROM pg_listening_channels()"),
    };
}

/// What a callback leaves behind in its session: settings, a session
/// advisory lock, a cursor WITH HOLD, a temporary table, a LISTEN. Returns
/// the backend's pid.
std::string leave_session_state(gate_t& gate) {
    return gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        tx.exec("SET statement_timeout = 50");
        tx.exec("SELECT set_config('work_mem', '7MB', false)");
        tx.exec("SELECT pg_advisory_lock(4848)");
        tx.exec("DECLARE bulkhead_pgb_cursor CURSOR WITH HOLD FOR SELECT 1");
        tx.exec("CREATE TEMP TABLE bulkhead_pgb_temp (x int)");
        tx.exec("LISTEN bulkhead_pgb");
        return std::string(exec_one_row(tx, "SELECT pg_backend_pid()")[0].c_str());
    });
}

/// Puts a server connection back as PgBouncer opened it (a test that left
/// state on purpose cleans up after itself: transaction mode will not).
void discard_all(libpq_client& client) {
    CHECK(client.query("SELECT pg_advisory_unlock_all()").ok);
    CHECK(client.query("DISCARD ALL").ok);
}

/// Options for a pool of `max_size` through PgBouncer's single-backend database.
bulkhead::pqxx_pool_options single_backend_options(const std::string& application_name, std::size_t max_size = 1) {
    auto options = pool_options(application_name, max_size);
    options.conninfo = single_backend_conninfo();
    return options;
}

}  // namespace

// --- H4 ---------------------------------------------------------------------------

TEST_CASE("[H4] the pgbouncer pass reaches the server through PgBouncer in transaction pooling mode, no reset query",
          "[pg][pgbouncer][H4]") {
    require_pgbouncer();
    // PgBouncer's admin console: a database named pgbouncer on the same port.
    libpq_client console(conninfo() + " dbname=pgbouncer");
    CHECK(console.value("SHOW VERSION").find(pgbouncer_version()) != std::string::npos);
    std::map<std::string, std::string> config;
    for (const std::vector<std::string>& row : console.rows("SHOW CONFIG")) {
        REQUIRE(row.size() >= 2);
        config[row[0]] = row[1];
    }
    CHECK(config["pool_mode"] == "transaction");
    CHECK(config["server_reset_query"].empty());
    // Two clients, one after the other, on one server backend: transaction
    // pooling, not a session per client.
    libpq_client first(single_backend_conninfo());
    libpq_client second(single_backend_conninfo());
    const std::string pid = first.value("SELECT pg_backend_pid()");
    CHECK(second.value("SELECT pg_backend_pid()") == pid);
    CHECK(first.value("SELECT pg_backend_pid()") == pid);
    // And what one leaves in the session reaches the other: no reset query.
    CHECK(first.query("SET statement_timeout = 4321").ok);
    CHECK(second.value("SHOW statement_timeout") == "4321ms");
    discard_all(second);
}

// --- H5 ---------------------------------------------------------------------------

TEST_CASE(
    "[H5] through PgBouncer the deadline, statement_timeout and lock_timeout bound one transaction, and the next "
    "client of its server connection gets none of them",
    "[pg][pgbouncer][H5]") {
    require_pgbouncer();
    bulkhead::pqxx_pool pool(single_backend_options("bulkhead-h5"));
    gate_t gate(pool, 1, 0);
    libpq_client next(single_backend_conninfo());
    const std::string pid = gate.transaction(1s, [](pqxx::dbtransaction& tx) {
        return std::string(exec_one_row(tx, "SELECT pg_backend_pid()")[0].c_str());
    });
    const auto next_client_sees_defaults = [&] {
        CHECK(next.value("SELECT pg_backend_pid()") == pid);  // the backend the gate's call just used
        CHECK(next.value("SHOW statement_timeout") == "0");
        CHECK(next.value("SHOW lock_timeout") == "0");
        CHECK(next.query("SELECT pg_sleep(0.3)").ok);  // would fail with 57014 under a leaked timeout
    };

    SECTION("the deadline becomes SET LOCAL statement_timeout: work_deadline_exceeded within deadline and slack") {
        long seen_timeout_ms = -1;
        const auto start = clock_type::now();
        try {
            gate.transaction({.deadline = clock_type::now() + 300ms}, [&](pqxx::dbtransaction& tx) {
                seen_timeout_ms =
                    exec_one_row(tx, "SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'")[0]
                        .as<long>();
                tx.exec("SELECT pg_sleep(5)");
            });
            FAIL("no exception");
        } catch (const bulkhead::work_deadline_exceeded& exceeded) {
            CHECK(sqlstate_of([&] { std::rethrow_if_nested(exceeded); }) == "57014");
        }
        const auto elapsed = clock_type::now() - start;
        CHECK(seen_timeout_ms > 0);
        CHECK(seen_timeout_ms <= 300);
        CHECK(elapsed >= 250ms);
        CHECK(elapsed < 1500ms);  // not the 5 s of pg_sleep
        next_client_sees_defaults();
    }
    SECTION("the call's own statement_timeout fails with 57014") {
        gate_t::options call;
        call.transaction.statement_timeout = 100ms;
        CHECK(sqlstate_of([&] {
                  gate.transaction(call, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(3)"); });
              }) == "57014");
        next_client_sees_defaults();
    }
    SECTION("the call's own lock_timeout fails with 55P03") {
        // The lock's holder is a client of PgBouncer's other database, so on
        // another server connection; it holds the lock for its transaction.
        auto holder_connection = outside_connection();
        pqxx::work holder(holder_connection);
        holder.exec("SELECT pg_advisory_xact_lock(4849)");
        gate_t::options call;
        call.transaction.lock_timeout = 100ms;
        CHECK(sqlstate_of([&] {
                  gate.transaction(call,
                                   [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_advisory_xact_lock(4849)"); });
              }) == "55P03");
        holder.commit();
        next_client_sees_defaults();
    }
    CHECK(gate.available() == 1);
    CHECK(pool.in_use() == 0);
}

// --- H6 ---------------------------------------------------------------------------

TEST_CASE("[H6] through PgBouncer a stop cancels the call's own statement on the server, and no other client's",
          "[pg][pgbouncer][H6]") {
    require_pgbouncer();
    SECTION("two clients run at once: the stopped call's statement ends with 57014, the other runs to its end") {
        bulkhead::pqxx_pool pool(pool_options("bulkhead-h6-stopped", 1));
        gate_t gate(pool, 1, 0);
        auto monitor = server_monitor();
        libpq_client other(conninfo() + " application_name=bulkhead-h6-other");
        std::stop_source stop;
        auto call = std::async(std::launch::async, [&] {
            gate.transaction({.stop = stop.get_token()},
                             [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(30)"); });
        });
        auto other_call = std::async(std::launch::async, [&] { return other.query("SELECT pg_sleep(1.5)"); });
        // Both statements run on the server, each on a backend of its own.
        await([&] { return running(monitor, "bulkhead-h6-stopped", "pg_sleep(30)") == 1; });
        await([&] { return running(monitor, "bulkhead-h6-other", "pg_sleep(1.5)") == 1; });
        check_cancelled_at_once(stop, call);
        CHECK(running(monitor, "bulkhead-h6-stopped", "pg_sleep(30)") == 0);
        const libpq_client::answer other_answer = other_call.get();
        CHECK(other_answer.ok);  // not cancelled: it slept its 1.5 s
        CHECK(other_answer.message.empty());
        CHECK(gate.available() == 1);
    }
    SECTION("stops at random moments, then another client on the same server connection: no cancel hits it") {
        // [E6] through PgBouncer: the stopped call and the next client take
        // turns on one backend, so a cancel that arrived late would cancel
        // the next client's statement.
        bulkhead::pqxx_pool pool(single_backend_options("bulkhead-h6-race"));
        gate_t gate(pool, 1, 0);
        libpq_client next(single_backend_conninfo());
        const random_stops counted =
            stop_at_random_moments(gate, 66, 150, [&] { return next.query("SELECT pg_sleep(0.002)").sqlstate; });
        INFO(counted.cancelled << " cancelled, " << counted.completed << " completed");
        CHECK(counted.hit_next == 0);
        CHECK(counted.cancelled > 0);
        CHECK(gate.available() == 1);
        CHECK(pool.in_use() == 0);
    }
}

// --- H7 ---------------------------------------------------------------------------

TEST_CASE(
    "[H7] through PgBouncer a COMMIT whose answer is lost is resolved: committed returns the value, lost before the "
    "server fails after the rollback is confirmed",
    "[pg][pgbouncer][H7]") {
    require_pgbouncer();
    // The proxy stands between the pool and PgBouncer (conninfo() names
    // PgBouncer): the client's connection to PgBouncer is what is lost.
    tcp_proxy proxy = proxy_to_server();
    scratch_table table("bulkhead_pgb_commit", "id int");
    bulkhead::pqxx_pool pool(proxied_options(proxy, "bulkhead-h7"));
    gate_t gate(pool, 1, 0);
    auto monitor = server_monitor();
    SECTION("the COMMIT reached the server, its answer is lost: the value, settled by the transaction's status") {
        check_lost_commit(gate, pool, proxy, table, commit_cut::after_the_server_committed);
    }
    SECTION("the COMMIT never reached the server: the call fails once the rollback is confirmed") {
        check_lost_commit(gate, pool, proxy, table, commit_cut::before_the_server_got_it);
    }
    // PgBouncer ended the server side of the lost client's transaction too:
    // no backend is left idle in it, holding its locks.
    await([&] { return sessions(monitor, "bulkhead-h7", "idle in transaction") == 0; });
    CHECK(gate.available() == 1);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 2")[0].as<int>(); }) == 2);
}

// --- H8 ---------------------------------------------------------------------------

TEST_CASE(
    "[H8] through PgBouncer the gate's session reset leaves nothing for the next client of the server connection, "
    "without it that client gets everything",
    "[pg][pgbouncer][H8]") {
    require_pgbouncer();
    libpq_client next(single_backend_conninfo());
    const std::string default_work_mem = next.value("SHOW work_mem");
    SECTION("with the reset (the default)") {
        bulkhead::pqxx_pool pool(single_backend_options("bulkhead-h8"));
        gate_t gate(pool, 1, 0);
        const std::string pid = leave_session_state(gate);
        const session_view seen = view_session(next);
        CHECK(seen.backend_pid == pid);  // the same server session, reset
        CHECK(seen.statement_timeout == "0");
        CHECK(seen.work_mem == default_work_mem);
        CHECK(seen.advisory_locks == "0");
        CHECK(seen.cursors == "0");
        CHECK(seen.temp_table == "none");
        CHECK(seen.listening == "0");
        CHECK(next.query("SELECT pg_sleep(0.1)").ok);
    }
    SECTION("without it (reset_session = false) PgBouncer hands every piece on") {
        auto options = single_backend_options("bulkhead-h8-off");
        options.reset_session = false;
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        const std::string pid = leave_session_state(gate);
        const session_view seen = view_session(next);
        CHECK(seen.backend_pid == pid);
        CHECK(seen.statement_timeout == "50ms");
        CHECK(seen.work_mem == "7MB");
        CHECK(seen.advisory_locks == "1");
        CHECK(seen.cursors == "1");
        CHECK(seen.temp_table != "none");
        CHECK(seen.listening == "1");
        CHECK(next.query("SELECT pg_sleep(0.1)").sqlstate == "57014");
        discard_all(next);
    }
}

TEST_CASE("[H8] through PgBouncer the session reset keeps the pool's application_name on every call",
          "[pg][pgbouncer][H8]") {
    require_pgbouncer();
    bulkhead::pqxx_pool pool(pool_options("bulkhead-h8-name", 1));
    gate_t gate(pool, 1, 0);
    auto monitor = server_monitor();
    for (int call = 0; call < 3; ++call) {
        // RESET ALL after each call sets the server session's start-up value,
        // PgBouncer's, and PgBouncer takes it for the client's: the pool sets
        // its own again in the same query.
        const auto [name, pid] = gate.transaction(1s, [](pqxx::dbtransaction& tx) {
            const pqxx::row row = exec_one_row(tx, "SELECT current_setting('application_name'), pg_backend_pid()");
            return std::pair{std::string(row[0].c_str()), row[1].as<int>()};
        });
        CHECK(name == "bulkhead-h8-name");
        CHECK(scalar<std::string>(monitor, "SELECT application_name FROM pg_stat_activity WHERE pid = " +
                                               std::to_string(pid)) == "bulkhead-h8-name");
    }
}

// --- What breaks ------------------------------------------------------------------

TEST_CASE(
    "through PgBouncer 1.18 a named prepared statement exists only on the server connection that prepared it, "
    "elsewhere 26000",
    "[pg][pgbouncer][breaks]") {
    require_pgbouncer();
    // What a driver does with a named statement: Parse once, then Bind and
    // Execute it in later transactions. PgBouncer 1.18 passes the Parse to
    // whichever server connection the client has at that moment (1.21 and
    // later can track them, with max_prepared_statements set; the fixture
    // leaves it unset).
    libpq_client app(conninfo());
    libpq_client neighbour(conninfo());
    REQUIRE(app.prepare("bulkhead_pgb_one", "SELECT 1").ok);
    const std::string prepared_on = app.value("SELECT pg_backend_pid()");
    // The neighbour's transaction takes that server connection (last in, first out) ...
    REQUIRE(neighbour.value("BEGIN; SELECT pg_backend_pid()") == prepared_on);
    // ... so the application's next transaction runs on another one.
    const libpq_client::answer executed = app.execute_prepared("bulkhead_pgb_one");
    CHECK_FALSE(executed.ok);
    CHECK(executed.sqlstate == "26000");
    CHECK_THAT(executed.message,
               Catch::Matchers::ContainsSubstring("prepared statement \"bulkhead_pgb_one\" does not exist"));
    // And the neighbour's session has a statement it never prepared.
    CHECK(neighbour.value("SELECT count(*) FROM pg_prepared_statements WHERE name = 'bulkhead_pgb_one'") == "1");
    CHECK(neighbour.query("DEALLOCATE bulkhead_pgb_one").ok);
    CHECK(neighbour.query("COMMIT").ok);
}

TEST_CASE(
    "through PgBouncer a session advisory lock stays with the server connection: its owner cannot unlock it, the "
    "next client of that connection holds it",
    "[pg][pgbouncer][breaks]") {
    require_pgbouncer();
    libpq_client app(conninfo());
    libpq_client neighbour(conninfo());
    const std::string locked_on = app.value("SELECT pg_advisory_lock(4850); SELECT pg_backend_pid()");
    REQUIRE(neighbour.value("BEGIN; SELECT pg_backend_pid()") == locked_on);
    // The neighbour's session holds the application's lock ...
    CHECK(neighbour.value("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4850 "
                          "AND pid = pg_backend_pid()") == "1");
    // ... and the application, on another server connection now, does not:
    // pg_advisory_unlock answers false (with the server's WARNING "you don't
    // own a lock of type ExclusiveLock").
    CHECK(app.value("SELECT pg_advisory_unlock(4850)") == "f");
    CHECK(neighbour.value("SELECT pg_advisory_unlock_all()").empty());
    CHECK(neighbour.query("COMMIT").ok);
}

TEST_CASE("through PgBouncer LISTEN hears nothing: a notification goes to the server connection, not the listener",
          "[pg][pgbouncer][breaks]") {
    require_pgbouncer();
    libpq_client listener(conninfo());
    libpq_client notifier(conninfo());
    REQUIRE(listener.query("LISTEN bulkhead_pgb_channel").ok);
    REQUIRE(notifier.query("NOTIFY bulkhead_pgb_channel, 'hello'").ok);
    // A listener on a session of its own has the notification with its next
    // answer; through PgBouncer it never comes.
    const auto give_up = clock_type::now() + 500ms;
    int heard = 0;
    while (clock_type::now() < give_up) {
        CHECK(listener.query("SELECT 1").ok);
        heard += listener.notifications();
        std::this_thread::sleep_for(20ms);  // polling a client that hears nothing, it orders nothing
    }
    CHECK(heard == 0);
    CHECK(listener.query("UNLISTEN *").ok);
}

TEST_CASE(
    "through PgBouncer on_connect's session settings belong to a server connection, not to the pool: the next "
    "client of that connection gets them",
    "[pg][pgbouncer][breaks]") {
    require_pgbouncer();
    auto options = single_backend_options("bulkhead-pgb-on-connect");
    options.on_connect = [](pqxx::connection& connection) {
        pqxx::nontransaction setup(connection);
        setup.exec("SET search_path = bulkhead_pgb, public");
    };
    libpq_client next(single_backend_conninfo());
    const std::string default_path = next.value("SHOW search_path");
    REQUIRE(default_path != "bulkhead_pgb, public");
    {
        bulkhead::pqxx_pool pool(options);
        gate_t gate(pool, 1, 0);
        CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) {
            return std::string(exec_one_row(tx, "SHOW search_path")[0].c_str());
        }) == "bulkhead_pgb, public");
    }
    // The gate's reset set it again after the call, on the server connection
    // the call used, which PgBouncer then lent to this client.
    CHECK(next.value("SHOW search_path") == "bulkhead_pgb, public");
    discard_all(next);
    CHECK(next.value("SHOW search_path") == default_path);
}
