// Contract section B: transactions, against a real PostgreSQL.
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include "catch.hpp"

#include <stdexcept>
#include <string>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

TEST_CASE("[B1] the callback runs inside one transaction on one pooled connection, committed by the gate", "[pg][B1]") {
    scratch_table table("bulkhead_b1", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b1"));
    gate_t gate(pool, 2, 0);
    auto monitor = outside_connection();

    const auto seen = gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        const int pid = exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>();
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
        // Inside a transaction block: the server says so, and the write is not yet visible outside.
        const auto in_block = exec_one_row(tx,
                                           "SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid() "
                                           "AND backend_xid IS NOT NULL")[0]
                                  .as<long>();
        const long outside_rows = scalar<long>(monitor, "SELECT count(*) FROM " + table.name());
        return std::tuple{pid, exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(), in_block, outside_rows};
    });
    CHECK(std::get<0>(seen) == std::get<1>(seen));  // one connection
    CHECK(std::get<2>(seen) == 1);                  // a transaction id was assigned: one transaction
    CHECK(std::get<3>(seen) == 0);                  // not committed while the callback ran
    CHECK(table.rows() == 1);                       // committed by the gate afterwards
}

TEST_CASE("[B2] the caller gets the value only after commit and after the connection went back to the pool",
          "[pg][B2]") {
    scratch_table table("bulkhead_b2", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b2"));
    gate_t gate(pool, 1, 0);
    std::size_t in_use_inside = 0;
    const int value = gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (7)");
        in_use_inside = pool.in_use();
        return 7;
    });
    CHECK(value == 7);
    CHECK(in_use_inside == 1);
    CHECK(pool.in_use() == 0);         // returned before the value reached us
    CHECK(pool.idle() == 1);           // and kept for reuse
    CHECK(table.rows("id = 7") == 1);  // committed before the value reached us
    CHECK(gate.available() == 1);
}

TEST_CASE("[B3] a callback that throws rolls back and the caller gets the same exception type", "[pg][B3]") {
    scratch_table table("bulkhead_b3", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b3"));
    gate_t gate(pool, 1, 0);
    struct domain_error_type {
        int code;
    };
    try {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
            throw domain_error_type{42};
        });
        FAIL("no exception");
    } catch (const domain_error_type& failure) {
        CHECK(failure.code == 42);
    }
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [&](pqxx::dbtransaction& tx) {
                                         exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (2)");
                                         throw std::out_of_range("callback");
                                     }),
                    std::out_of_range);
    CHECK(table.rows() == 0);
    CHECK(pool.in_use() == 0);
    CHECK(gate.available() == 1);
}

TEST_CASE("[B4] an SQL error in the callback rolls back and reaches the caller with its SQLSTATE", "[pg][B4]") {
    scratch_table table("bulkhead_b4", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b4"));
    gate_t gate(pool, 1, 0);
    const auto unique_violation = sqlstate_of([&] {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
        });
    });
    CHECK(unique_violation == "23505");
    CHECK(sqlstate_of([&] { gate.transaction(1s, [](pqxx::dbtransaction& tx) { exec_one_row(tx, "SELECT 1/0"); }); }) ==
          "22012");
    CHECK_THROWS_AS(gate.transaction(1s, [](pqxx::dbtransaction& tx) { exec_no_rows(tx, "SELEKT 1"); }),
                    pqxx::syntax_error);
    CHECK(table.rows() == 0);
    // The connection is healthy afterwards.
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 5")[0].as<int>(); }) == 5);
    CHECK(pool.size() == 1);
}

TEST_CASE("[B5] a commit that fails leaves nothing committed, releases the permits and a healthy pool", "[pg][B5]") {
    scratch_table parent("bulkhead_b5_parent", "id int PRIMARY KEY");
    scratch_table child("bulkhead_b5_child", "id int PRIMARY KEY, parent int REFERENCES " + parent.name() +
                                                 "(id) DEFERRABLE INITIALLY DEFERRED");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b5"));
    gate_t gate(pool, 1, 0);
    // The statements succeed; the deferred foreign key fails only at COMMIT.
    const auto state = sqlstate_of([&] {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + child.name() + " VALUES (1, 99)");
            exec_no_rows(tx, "INSERT INTO " + parent.name() + " VALUES (5)");
        });
    });
    CHECK(state == "23503");
    CHECK(child.rows() == 0);
    CHECK(parent.rows() == 0);
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 1);
    CHECK(pool.in_use() == 0);
    gate.transaction(
        1s, [&](pqxx::dbtransaction& tx) { exec_no_rows(tx, "INSERT INTO " + parent.name() + " VALUES (5)"); });
    CHECK(parent.rows() == 1);
}

TEST_CASE(
    "[B6] a rollback that fails does not hide the original exception, the connection is discarded and "
    "the failure reported",
    "[pg][B6]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b6"));
    bulkhead::db_bulkhead<bulkhead::pqxx_pool, counting_observer> gate(pool, 1, 0);
    auto monitor = outside_connection();
    int first_pid = 0;
    CHECK_THROWS_WITH(gate.transaction(1s,
                                       [&](pqxx::dbtransaction& tx) {
                                           first_pid = exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>();
                                           terminate_backend(monitor, first_pid);  // the server connection dies
                                           throw std::runtime_error("original failure");
                                       }),
                      "original failure");
    CHECK(gate.observer().rollback_failures == 1);
    CHECK(pool.in_use() == 0);
    CHECK(pool.size() == 0);  // discarded, not kept
    const int next_pid = gate.transaction(
        1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(); });
    CHECK(next_pid != first_pid);
    CHECK(gate.available() == 1);
}

TEST_CASE("[B7] a connection that broke during the call is discarded, the next call gets a fresh one", "[pg][B7]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b7"));
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    int first_pid = 0;
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [&](pqxx::dbtransaction& tx) {
                                         first_pid = exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>();
                                         terminate_backend(monitor, first_pid);
                                         exec_one_row(tx, "SELECT 1");  // fails: the connection is gone
                                     }),
                    pqxx::broken_connection);
    CHECK(pool.in_use() == 0);
    CHECK(pool.size() == 0);
    const int next_pid = gate.transaction(
        1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(); });
    CHECK(next_pid != first_pid);
    CHECK(pool.size() == 1);
}

TEST_CASE("[B8] committing or rolling back inside the callback is refused, then rolled back", "[pg][B8]") {
    scratch_table table("bulkhead_b8", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b8"));
    gate_t gate(pool, 1, 0);
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [&](pqxx::dbtransaction& tx) {
                                         exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
                                         tx.commit();
                                     }),
                    std::logic_error);
    CHECK_THROWS_AS(gate.transaction(1s,
                                     [&](pqxx::dbtransaction& tx) {
                                         exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (2)");
                                         tx.abort();
                                     }),
                    std::logic_error);
    CHECK(table.rows() == 0);
    CHECK(pool.in_use() == 0);
    CHECK(gate.available() == 1);
    auto monitor = outside_connection();
    CHECK(sessions(monitor, "bulkhead-b8", "idle in transaction") == 0);
}

TEST_CASE("[B9] a committed write is visible from another connection, a rolled-back one is not", "[pg][B9]") {
    scratch_table table("bulkhead_b9", "id int PRIMARY KEY");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b9"));
    gate_t gate(pool, 1, 0);
    gate.transaction(1s,
                     [&](pqxx::dbtransaction& tx) { exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)"); });
    CHECK_THROWS(gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (2)");
        throw std::runtime_error("undo");
    }));
    auto other = outside_connection();
    CHECK(scalar<long>(other, "SELECT count(*) FROM " + table.name() + " WHERE id = 1") == 1);
    CHECK(scalar<long>(other, "SELECT count(*) FROM " + table.name() + " WHERE id = 2") == 0);
}

TEST_CASE("[B10] statements in one callback see one now() and one transaction id", "[pg][B10]") {
    scratch_table table("bulkhead_b10", "id int PRIMARY KEY, at timestamptz, xid bigint");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-b10"));
    gate_t gate(pool, 1, 0);
    gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1, now(), txid_current())");
        tx.exec("SELECT pg_sleep(0.02)");
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (2, now(), txid_current())");
    });
    auto other = outside_connection();
    CHECK(scalar<long>(other, "SELECT count(DISTINCT at) FROM " + table.name()) == 1);
    CHECK(scalar<long>(other, "SELECT count(DISTINCT xid) FROM " + table.name()) == 1);
    CHECK(table.rows() == 2);
}
