// Helpers shared by the [pg] contract tests: a pool per test with its own
// application_name (so server-side counts see only that test's sessions), an
// outside connection for checks the gate must not influence, and a few
// one-line queries.
#pragma once

#include "pg_test_database.hpp"
#include "pqxx_compat.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include "catch.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>

namespace bulkhead_test {

using namespace std::chrono_literals;

/// Pool options for a test: the suite's server, a test-specific application
/// name, short timeouts so failures show quickly.
inline bulkhead::pqxx_pool_options pool_options(const std::string& application_name, std::size_t max_size = 4) {
    return bulkhead::pqxx_pool_options{
        .conninfo = conninfo(),
        .max_size = max_size,
        .min_idle = 0,
        .connection_timeout = 2s,
        .validation_timeout = 1s,
        .application_name = application_name,
    };
}

/// A connection of its own, outside any pool or gate.
inline pqxx::connection outside_connection() { return pqxx::connection(conninfo()); }

/// The first column of the first row of `sql`, run in its own transaction.
template <class T>
T scalar(pqxx::connection& connection, const std::string& sql) {
    pqxx::nontransaction tx(connection);
    return exec_one_row(tx, sql)[0].as<T>();
}

/// The condition on pg_stat_activity that leaves out the monitor's own
/// session: through PgBouncer that is a server session lent to the monitor,
/// which may still carry the application_name of the client before it.
inline constexpr const char* not_the_monitor = " AND pid <> pg_backend_pid()";

/// Sessions of `application_name` on the server in the given state
/// ('active', 'idle', 'idle in transaction', ...), or all when state is empty;
/// never the monitor's own.
inline long sessions(pqxx::connection& monitor, const std::string& application_name, const std::string& state = "") {
    pqxx::nontransaction tx(monitor);
    std::string sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = " + tx.quote(application_name) +
                      not_the_monitor;
    if (!state.empty()) {
        sql += " AND state = " + tx.quote(state);
    }
    return exec_one_row(tx, sql)[0].as<long>();
}

/// Sessions of `application_name` running a statement whose text holds
/// `text` (state 'active'): the statement itself, not the BEGIN before it;
/// never the monitor's own (whose query holds `text` too).
inline long running(pqxx::connection& monitor, const std::string& application_name, const std::string& text) {
    pqxx::nontransaction tx(monitor);
    return exec_one_row(tx,
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = " + tx.quote(application_name) +
                            not_the_monitor + " AND state = 'active' AND strpos(query, " + tx.quote(text) + ") > 0")[0]
        .as<long>();
}

/// Terminates a backend and waits until it is gone from pg_stat_activity.
inline void terminate_backend(pqxx::connection& monitor, int pid) {
    {
        pqxx::nontransaction tx(monitor);
        tx.exec("SELECT pg_terminate_backend(" + std::to_string(pid) + ")");
    }
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    for (;;) {
        pqxx::nontransaction tx(monitor);
        if (exec_one_row(tx, "SELECT count(*) FROM pg_stat_activity WHERE pid = " + std::to_string(pid))[0]
                .as<long>() == 0) {
            return;
        }
        REQUIRE(std::chrono::steady_clock::now() < give_up);
        std::this_thread::sleep_for(5ms);  // polling the server, not ordering threads
    }
}

/// The SQLSTATE of a pqxx::sql_error thrown by `call`, or "" if none was thrown.
template <class Call>
std::string sqlstate_of(Call&& call) {
    try {
        call();
    } catch (const pqxx::sql_error& failure) {
        return failure.sqlstate();
    }
    return "";
}

/// An observer that counts what it hears.
struct counting_observer {
    std::atomic<int> rejections{0};
    std::atomic<int> rollback_failures{0};
    void on_rejected(bulkhead::reject_reason /*reason*/) noexcept { ++rejections; }
    void on_rollback_failed(std::exception_ptr /*failure*/) noexcept { ++rollback_failures; }
};

/// A scratch table owned by one test, dropped before and after.
class scratch_table {
public:
    /// `name` with this process's id after it: the direct pass and the
    /// pgbouncer pass of one test never share a table, also when they run
    /// at the same time.
    scratch_table(const std::string& name, const std::string& columns)
        : m_name(name + "_" + std::to_string(::getpid())) {
        auto connection = outside_connection();
        pqxx::work tx(connection);
        exec_no_rows(tx, "DROP TABLE IF EXISTS " + m_name);
        exec_no_rows(tx, "CREATE TABLE " + m_name + " (" + columns + ")");
        tx.commit();
    }
    scratch_table(const scratch_table&) = delete;
    scratch_table& operator=(const scratch_table&) = delete;
    ~scratch_table() {
        try {
            auto connection = outside_connection();
            pqxx::work tx(connection);
            exec_no_rows(tx, "DROP TABLE IF EXISTS " + m_name);
            tx.commit();
        } catch (...) {  // best effort: the next run drops it first anyway
        }
    }
    [[nodiscard]] const std::string& name() const noexcept { return m_name; }
    [[nodiscard]] long rows(const std::string& where = "true") const {
        auto connection = outside_connection();
        return scalar<long>(connection, "SELECT count(*) FROM " + m_name + " WHERE " + where);
    }

private:
    std::string m_name;
};

}  // namespace bulkhead_test
