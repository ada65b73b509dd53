// Contract section J: round trips, counted on the wire by the benchmark
// harness's relay (bench/pg/wire_counter.hpp), and the deferred BEGIN of
// bulkhead::pqxx_transaction.
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"
#include "wire_counter.hpp"

#include "catch.hpp"

#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

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
