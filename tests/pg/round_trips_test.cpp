// Contract section J: round trips, counted on the wire by the benchmark
// harness's relay (bench/pg/wire_counter.hpp), and the deferred BEGIN of
// bulkhead::pqxx_transaction.
#include "fault_helpers.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"
#include "wire_counter.hpp"

#include "catch.hpp"

#include <functional>
#include <future>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

namespace {

/// A pool and a gate (B = 1) whose one connection goes through a counting
/// relay, opened before the first count.
struct counted_gate {
    explicit counted_gate(const std::string& application_name, std::function<void(pqxx::connection&)> on_connect = {})
        : relay(conninfo()), pool(options(application_name, std::move(on_connect))), gate(pool, 1, 0) {
        gate.transaction(1s, [](pqxx::dbtransaction& tx) { (void)exec_one_row(tx, "SELECT 1"); });
    }

    /// Round trips that `call` made.
    template <class Call>
    std::uint64_t round_trips(Call&& call) {
        const std::uint64_t before = relay.round_trips();
        std::forward<Call>(call)();
        return relay.round_trips() - before;
    }

    bulkhead_bench::wire_counter relay;
    bulkhead::pqxx_pool pool;
    gate_t gate;

private:
    bulkhead::pqxx_pool_options options(const std::string& application_name,
                                        std::function<void(pqxx::connection&)> on_connect) const {
        bulkhead::pqxx_pool_options settings = pool_options(application_name, 1);
        settings.conninfo = relay.for_clients(conninfo());
        settings.on_connect = std::move(on_connect);
        return settings;
    }
};

}  // namespace

TEST_CASE("[J1] through bulkhead::pqxx_transaction, N statements make N + 1 round trips, none make none", "[pg][J1]") {
    counted_gate counted("bulkhead-j1");
    for (int statements = 1; statements <= 3; ++statements) {
        DYNAMIC_SECTION("exec first, then bound statements, " << statements << " statement(s)") {
            long sum = 0;
            CHECK(counted.round_trips([&] {
                sum = counted.gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) {
                    long total = tx.exec("SELECT 2")[0][0].as<long>();
                    for (int i = 2; i <= statements; ++i) {
                        total += tx.exec_params("SELECT $1::int + 1", i)[0][0].as<long>();
                    }
                    return total;
                });
            }) == static_cast<std::uint64_t>(statements + 1));
            CHECK(sum == statements * (statements + 1) / 2 + statements);
        }
        DYNAMIC_SECTION("a bound first statement goes after BEGIN, alone: N + 2, " << statements << " statement(s)") {
            CHECK(counted.round_trips([&] {
                counted.gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) {
                    for (int i = 0; i < statements; ++i) {
                        CHECK(tx.exec_params("SELECT $1::int", i)[0][0].as<int>() == i);
                    }
                });
            }) == static_cast<std::uint64_t>(statements + 2));
        }
        DYNAMIC_SECTION("exec, " << statements << " statement(s)") {
            CHECK(counted.round_trips([&] {
                counted.gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) {
                    for (int i = 0; i < statements; ++i) {
                        CHECK(tx.exec("SELECT 2")[0][0].as<int>() == 2);
                    }
                });
            }) == static_cast<std::uint64_t>(statements + 1));
        }
        DYNAMIC_SECTION("a read-write transaction that writes, its COMMIT's outcome tracked, " << statements
                                                                                               << " statement(s)") {
            scratch_table table("bulkhead_j1", "id int PRIMARY KEY");
            CHECK(counted.round_trips([&] {
                counted.gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) {
                    for (int i = 0; i < statements; ++i) {
                        (void)tx.exec("INSERT INTO " + table.name() + " VALUES (" + std::to_string(i) + ")");
                    }
                });
            }) == static_cast<std::uint64_t>(statements + 1));
            CHECK(table.rows() == statements);
        }
    }
    SECTION("a callback that runs nothing sends nothing") {
        CHECK(counted.round_trips([&] {
            CHECK(counted.gate.transaction(1s, [](bulkhead::pqxx_transaction& tx) { return tx.begun(); }) == false);
        }) == 0);
        CHECK(counted.pool.idle() == 1);
    }
    SECTION("a callback that takes pqxx::dbtransaction& keeps the eager BEGIN: N + 2") {
        CHECK(counted.round_trips([&] {
            counted.gate.transaction(1s, [](pqxx::dbtransaction& tx) { (void)exec_one_row(tx, "SELECT 1"); });
        }) == 3);
    }
}

TEST_CASE("[J1] exec_prepared is bound as libpqxx binds it, and as a first statement it goes after BEGIN alone",
          "[pg][J1][direct]") {
    // [direct]: a named prepared statement lives on one server connection,
    // which PgBouncer's transaction pooling does not keep (docs/pgbouncer.md).
    counted_gate counted("bulkhead-j1-prepared", [](pqxx::connection& connection) {
        connection.prepare("j1_add", "SELECT $1::int + $2::int");
    });
    std::uint64_t trips = 0;
    int value = 0;
    // The first call may prepare the statement on the server (libpqxx 6
    // prepares it when first used): one round trip more, once.
    (void)counted.gate.transaction(
        1s, [](bulkhead::pqxx_transaction& tx) { return tx.exec_prepared("j1_add", 1, 1)[0][0].as<int>(); });
    trips = counted.round_trips([&] {
        value = counted.gate.transaction(1s, [](bulkhead::pqxx_transaction& tx) {
            const int first = tx.exec_prepared("j1_add", 20, 1)[0][0].as<int>();
            return first + tx.exec_prepared("j1_add", 20, 1)[0][0].as<int>();
        });
    });
    CHECK(value == 42);
    CHECK(trips == 4);
}

TEST_CASE("[J3] no statement runs outside the call's transaction, whatever the entry point", "[pg][J3]") {
    scratch_table table("bulkhead_j3", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-j3", 1));
    gate_t gate(pool, 1, 0);
    const std::string insert = "INSERT INTO " + table.name() + " VALUES ";
    struct rolled_back {};
    // Each entry point writes a row, then the callback throws: the row is
    // gone only if the write ran inside the call's transaction.
    const auto written_then_thrown = [&](const std::function<void(bulkhead::pqxx_transaction&)>& write,
                                         bool check_connection = true) {
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](bulkhead::pqxx_transaction& tx) {
                                             write(tx);
                                             CHECK(tx.begun());
                                             throw rolled_back{};
                                         }),
                        rolled_back);
        CHECK(table.rows() == 0);
        CHECK(gate.available() == 1);
        if (check_connection) {
            CHECK(pool.idle() == 1);  // kept: the rollback ended the transaction cleanly
        }
    };
    SECTION("exec") {
        written_then_thrown([&](bulkhead::pqxx_transaction& tx) { (void)tx.exec(insert + "(1)"); });
    }
    SECTION("exec_params") {
        written_then_thrown([&](bulkhead::pqxx_transaction& tx) { (void)tx.exec_params(insert + "($1)", 1); });
    }
    SECTION("pqxx(), then libpqxx's exec") {
        written_then_thrown([&](bulkhead::pqxx_transaction& tx) { (void)tx.pqxx().exec(insert + "(1)"); });
    }
    SECTION("pqxx(), then libpqxx's bound statement (exec_params; exec(sql, params) from libpqxx 7.10)") {
        written_then_thrown([&](bulkhead::pqxx_transaction& tx) {
            (void)bulkhead::detail::pqxx_compat::exec_params(tx.pqxx(), insert + "($1)", 1);
        });
    }
    SECTION("pqxx(), then COPY through a stream") {
        // Whether the pool keeps the connection after a COPY is not this
        // case's question (with libpqxx 6 it closes it); the row is.
        written_then_thrown(
            [&](bulkhead::pqxx_transaction& tx) {
                auto stream = stream_into(tx.pqxx(), table.name());
                write_one(stream, 1);
                stream.complete();
            },
            false);
    }
    SECTION("a later statement after the first") {
        written_then_thrown([&](bulkhead::pqxx_transaction& tx) {
            (void)tx.exec("SELECT 1");
            (void)tx.exec_params(insert + "($1)", 1);
        });
    }
}

TEST_CASE("[J3] exec_prepared runs inside the call's transaction", "[pg][J3][direct]") {
    scratch_table table("bulkhead_j3_prepared", "id int PRIMARY KEY");
    bulkhead::pqxx_pool_options options = pool_options("bulkhead-j3-prepared", 1);
    const std::string insert = "INSERT INTO " + table.name() + " VALUES ($1)";
    options.on_connect = [&](pqxx::connection& connection) { connection.prepare("j3_insert", insert); };
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    struct rolled_back {};
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [&](bulkhead::pqxx_transaction& tx) {
                                         (void)tx.exec_prepared("j3_insert", 1);
                                         throw rolled_back{};
                                     }),
                    rolled_back);
    CHECK(table.rows() == 0);
    gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) { (void)tx.exec_prepared("j3_insert", 2); });
    CHECK(table.rows("id = 2") == 1);
}

TEST_CASE("[J3] a first statement that fails ends the transaction: nothing after it runs, nothing commits",
          "[pg][J3]") {
    scratch_table table("bulkhead_j3_failed", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-j3-failed", 1));
    gate_t gate(pool, 1, 0);
    const std::string insert = "INSERT INTO " + table.name() + " VALUES ";
    SECTION("its error reaches the caller, the connection is kept") {
        CHECK_THROWS_AS(gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) { (void)tx.exec("SELECT 1/0"); }),
                        pqxx::sql_error);
    }
    SECTION("a callback that catches it cannot go on, and still fails") {
        bool refused = false;
        CHECK_THROWS_AS(gate.transaction(1s,
                                         [&](bulkhead::pqxx_transaction& tx) {
                                             try {
                                                 (void)tx.exec(insert + "(1 / 0)");
                                             } catch (const pqxx::sql_error&) {
                                             }
                                             try {
                                                 (void)tx.exec(insert + "(2)");
                                             } catch (const std::logic_error&) {
                                                 refused = true;
                                             }
                                         }),
                        pqxx::sql_error);
        CHECK(refused);
    }
    CHECK(table.rows() == 0);
    CHECK(pool.idle() == 1);
    CHECK(gate.available() == 1);
    // The kept connection is clean: the next call commits.
    gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) { (void)tx.exec(insert + "(3)"); });
    CHECK(table.rows() == 1);
}

// --- J2: one statement in one round trip ------------------------------------------

namespace {

/// The backend of the gate's one connection.
int backend_of(gate_t& gate) { return gate.execute({.queue_wait = 1s}, "SELECT pg_backend_pid()").as<int>(0, 0); }

}  // namespace

TEST_CASE("[J2] execute() runs one statement as a whole transaction in one round trip, committed", "[pg][J2]") {
    counted_gate counted("bulkhead-j2");
    scratch_table table("bulkhead_j2", "id int primary key, note text");
    auto monitor = outside_connection();
    SECTION("a write with parameters: one round trip, the row committed, its count returned") {
        bulkhead::statement_result written;
        CHECK(counted.round_trips([&] {
            written =
                counted.gate.execute({.queue_wait = 1s}, "INSERT INTO " + table.name() + " VALUES ($1, $2), ($3, $4)",
                                     1, "one", 2, std::optional<std::string>{});
        }) == 1);
        CHECK(written.affected_rows() == 2);
        CHECK(written.command_tag() == "INSERT 0 2");
        CHECK(written.empty());
        CHECK(table.rows() == 2);
        CHECK(table.rows("note IS NULL") == 1);
    }
    SECTION("rows come back as text, NULLs as nullopt, converted as libpqxx converts") {
        bulkhead::statement_result rows;
        CHECK(counted.round_trips([&] {
            rows = counted.gate.execute({.queue_wait = 1s},
                                        "SELECT $1::int + 1 AS sum, NULL::text AS nothing, $2::text AS word "
                                        "FROM generate_series(1, 3)",
                                        2, std::string_view("word"));
        }) == 1);
        CHECK(rows.size() == 3);
        CHECK(rows.columns() == 3);
        CHECK(rows.column_name(1) == "nothing");
        CHECK(rows.as<int>(2, 0) == 3);
        CHECK_FALSE(rows.get(0, 1).has_value());
        CHECK(rows.get(0, 2) == std::optional<std::string_view>("word"));
        CHECK(rows.affected_rows() == 3);
        CHECK_THROWS_AS(rows.as<int>(0, 1), std::logic_error);  // NULL
        CHECK_THROWS_AS(rows.get(3, 0), std::out_of_range);
        CHECK_THROWS_AS(rows.get(0, 3), std::out_of_range);
    }
    SECTION("read only, without outcome tracking, with a deadline: still one round trip") {
        decltype(counted.gate)::options call{.queue_wait = 1s};
        call.transaction.read_only = true;
        CHECK(counted.round_trips([&] { (void)counted.gate.execute(call, "SELECT 1"); }) == 1);
        call.transaction.read_only = false;
        call.transaction.resolve_commit_outcome = false;
        CHECK(counted.round_trips(
                  [&] { (void)counted.gate.execute(call, "INSERT INTO " + table.name() + " VALUES (3)"); }) == 1);
        call.transaction.resolve_commit_outcome = true;
        call.deadline = std::chrono::steady_clock::now() + 5s;
        call.transaction.lock_timeout = 1s;
        const auto timeouts =
            counted.gate.execute(call, "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')");
        CHECK(timeouts.get(0, 1) == std::optional<std::string_view>("1s"));  // SET LOCAL ran before it
        CHECK(timeouts.get(0, 0) != std::optional<std::string_view>("0"));   // from the deadline
        CHECK(table.rows() == 1);
    }
    SECTION("COPY TO STDOUT runs, its rows dropped, its count kept") {
        CHECK(
            counted.gate.execute({.queue_wait = 1s}, "COPY (SELECT 1 UNION ALL SELECT 2) TO STDOUT").affected_rows() ==
            2);
    }
    SECTION("from a callback: tx.exec_with_commit(), the same one round trip") {
        bulkhead::statement_result kept;
        CHECK(counted.round_trips([&] {
            kept = counted.gate.transaction(1s, [&](bulkhead::pqxx_transaction& tx) {
                auto result = tx.exec_with_commit("INSERT INTO " + table.name() + " VALUES ($1) RETURNING id", 7);
                CHECK_FALSE(tx.begun());
                // Nothing has run yet: the result is empty until the gate commits.
                CHECK_THROWS_AS(result.size(), std::logic_error);
                return result;
            });
        }) == 1);
        CHECK(kept.as<int>(0, 0) == 7);
        CHECK(table.rows("id = 7") == 1);
    }
    CHECK(counted.gate.available() == 1);
    CHECK(counted.pool.size() == 1);  // the same connection throughout
}

TEST_CASE("[J2] a statement that fails commits nothing, its error reaches the caller, the connection is kept",
          "[pg][J2]") {
    counted_gate counted("bulkhead-j2-fails");
    scratch_table table("bulkhead_j2_fails", "id int primary key");
    (void)counted.gate.execute({.queue_wait = 1s}, "INSERT INTO " + table.name() + " VALUES (1)");
    const int backend = backend_of(counted.gate);
    SECTION("a unique violation: libpqxx's exception type and SQLSTATE; ROLLBACK follows in one round trip") {
        CHECK(counted.round_trips([&] {
            CHECK_THROWS_AS(counted.gate.execute({.queue_wait = 1s}, "INSERT INTO " + table.name() + " VALUES ($1)", 1),
                            pqxx::unique_violation);
        }) == 2);
    }
    SECTION("a syntax error") {
        CHECK(sqlstate_of([&] { (void)counted.gate.execute({.queue_wait = 1s}, "SELEC 1"); }) == "42601");
    }
    SECTION("two statements in one string are refused by the server: the extended protocol runs one") {
        CHECK(sqlstate_of([&] {
                  (void)counted.gate.execute(
                      {.queue_wait = 1s},
                      "INSERT INTO " + table.name() + " VALUES (2); INSERT INTO " + table.name() + " VALUES (3)");
              }) == "42601");
    }
    SECTION("COPY FROM STDIN fails on the server, which finds the pipeline's next message where it wanted rows") {
        CHECK_THROWS_AS(counted.gate.execute({.queue_wait = 1s}, "COPY " + table.name() + " FROM STDIN"),
                        pqxx::sql_error);
        CHECK(table.rows() == 1);
        CHECK(counted.pool.size() == 0);  // closed after it
        return;
    }
    CHECK(table.rows() == 1);
    CHECK(counted.gate.available() == 1);
    CHECK(backend_of(counted.gate) == backend);  // rolled back and reset, then kept
    CHECK(counted.gate.stats().failed >= 1);
}

TEST_CASE("[J2] exec_with_commit is the transaction's only statement, and misuse runs nothing", "[pg][J2]") {
    counted_gate counted("bulkhead-j2-only");
    scratch_table table("bulkhead_j2_only", "id int");
    const std::string insert = "INSERT INTO " + table.name() + " VALUES (1)";
    SECTION("after another statement") {
        CHECK_THROWS_AS(counted.gate.transaction(1s,
                                                 [&](bulkhead::pqxx_transaction& tx) {
                                                     (void)tx.exec(insert);
                                                     return tx.exec_with_commit(insert);
                                                 }),
                        std::logic_error);
    }
    SECTION("before another statement, or a second one") {
        CHECK_THROWS_AS(counted.gate.transaction(1s,
                                                 [&](bulkhead::pqxx_transaction& tx) {
                                                     auto result = tx.exec_with_commit(insert);
                                                     (void)tx.exec(insert);
                                                     return result;
                                                 }),
                        std::logic_error);
        CHECK_THROWS_AS(counted.gate.transaction(1s,
                                                 [&](bulkhead::pqxx_transaction& tx) {
                                                     (void)tx.exec_with_commit(insert);
                                                     return tx.exec_with_commit(insert);
                                                 }),
                        std::logic_error);
        CHECK_THROWS_AS(counted.gate.transaction(1s,
                                                 [&](bulkhead::pqxx_transaction& tx) {
                                                     auto result = tx.exec_with_commit(insert);
                                                     (void)tx.pqxx();
                                                     return result;
                                                 }),
                        std::logic_error);
    }
    SECTION("a NUL in the statement or a parameter") {
        CHECK_THROWS_AS(counted.gate.execute({.queue_wait = 1s}, std::string("SELECT 1\0", 9)), std::invalid_argument);
        CHECK_THROWS_AS(counted.gate.execute({.queue_wait = 1s}, "SELECT $1", std::string("a\0b", 3)),
                        std::invalid_argument);
    }
    SECTION("a statement that ends the transaction block: misuse, the connection discarded") {
        CHECK_THROWS_AS(counted.gate.execute({.queue_wait = 1s}, "COMMIT"), std::logic_error);
        CHECK(counted.pool.stats().closed_for(bulkhead::close_reason::discarded) == 1);
    }
    CHECK(table.rows() == 0);
    CHECK(counted.gate.available() == 1);
}

TEST_CASE("[J2] a lost COMMIT of execute() is settled as any other", "[pg][J2][commit]") {
    scratch_table table("bulkhead_j2_lost", "id int");
    proxied_gate proxied("bulkhead-j2-lost");
    const std::string insert = "INSERT INTO " + table.name() + " VALUES (1)";
    (void)proxied.gate.execute({.queue_wait = 1s}, "SELECT 1");  // connect while the proxy lets us
    SECTION("after the server committed: the result comes back") {
        proxied.proxy.arm(tcp_proxy::cut::drop_after_commit);
        CHECK(proxied.gate.execute({.queue_wait = 1s}, insert).affected_rows() == 1);
        CHECK(proxied.proxy.cuts() == 1);
        CHECK(table.rows() == 1);
    }
    SECTION("before the server got it: the rollback is confirmed") {
        proxied.proxy.arm(tcp_proxy::cut::drop_before_commit);
        CHECK_THAT(message_of<pqxx::broken_connection>([&] { (void)proxied.gate.execute({.queue_wait = 1s}, insert); }),
                   Catch::Matchers::ContainsSubstring("confirms the transaction was rolled back"));
        CHECK(proxied.proxy.cuts() == 1);
        CHECK(table.rows() == 0);
    }
    SECTION("the id's answer lost too: commit_unknown, never a guess") {
        proxied.proxy.arm(tcp_proxy::cut::drop_commit_and_id);
        CHECK_THROWS_AS(proxied.gate.execute({.queue_wait = 1s}, insert), bulkhead::commit_unknown);
        CHECK(proxied.proxy.cuts() == 1);
        CHECK(table.rows() == 1);  // it did commit: "unknown" is not "failed"
    }
    CHECK(proxied.proxy.pipelined_commits() >= 2);
    CHECK(proxied.gate.available() == 1);
}

TEST_CASE("[J2] the deadline bounds execute(), also on a server that stops answering", "[pg][J2][deadline][direct]") {
    scratch_table table("bulkhead_j2_deadline", "id int");
    proxied_gate proxied("bulkhead-j2-deadline");
    const int backend = backend_of(proxied.gate);
    SECTION("a statement that runs into the deadline: work_deadline_exceeded, nothing committed, connection kept") {
        const auto start = clock_type::now();
        CHECK_THROWS_AS(proxied.gate.execute({.deadline = start + 300ms},
                                             "INSERT INTO " + table.name() + " SELECT 1 FROM pg_sleep(10)"),
                        bulkhead::work_deadline_exceeded);
        CHECK(clock_type::now() - start < 300ms + 200ms);
        CHECK(backend_of(proxied.gate) == backend);
    }
    SECTION("a frozen backend: the watchdog ends the call by the deadline and its slack; the outcome is unknown") {
        // The whole transaction, COMMIT included, is in the frozen server's
        // socket: it would run it once thawed. So it is commit_unknown.
        frozen_backend frozen(backend);
        const auto start = clock_type::now();
        CHECK_THROWS_AS(
            proxied.gate.execute({.deadline = start + 300ms}, "INSERT INTO " + table.name() + " VALUES (1)"),
            bulkhead::commit_unknown);
        CHECK(clock_type::now() - start < 300ms + 250ms + 300ms);
        frozen.thaw();
    }
    SECTION("the same, read only: nothing was written, the deadline is blamed") {
        frozen_backend frozen(backend);
        decltype(proxied.gate)::options call{.deadline = clock_type::now() + 300ms};
        call.transaction.read_only = true;
        const auto start = clock_type::now();
        CHECK_THROWS_AS(proxied.gate.execute(call, "SELECT 1"), bulkhead::work_deadline_exceeded);
        CHECK(clock_type::now() - start < 300ms + 250ms + 300ms);
        frozen.thaw();
    }
    CHECK(proxied.gate.available() == 1);
}

TEST_CASE("[J2] a stop request cancels execute()'s statement on the server, the connection is reused",
          "[pg][J2][cancel][direct]") {
    scratch_table table("bulkhead_j2_stop", "id int");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-j2-stop", 1));
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int backend = backend_of(gate);
    std::stop_source source;
    auto call = std::async(std::launch::async, [&] {
        (void)gate.execute({.stop = source.get_token()}, "INSERT INTO " + table.name() + " SELECT 1 FROM pg_sleep(10)");
    });
    await([&] { return running(monitor, "bulkhead-j2-stop", "pg_sleep(10)") == 1; });
    check_cancelled_at_once(source, call);
    CHECK(table.rows() == 0);
    CHECK(gate.available() == 1);
    CHECK(backend_of(gate) == backend);
}
