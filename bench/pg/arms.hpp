// bench/pg: the workloads and the four arms of the comparison.
//
//   (a) raw      libpqxx alone: one dedicated pqxx::connection per worker,
//                pqxx::work, commit. The floor.
//   (b) pool     bulkhead::pqxx_pool alone, as many workers as connections:
//                acquire, pqxx::work on the lease's connection, commit.
//   (c) gate     db_bulkhead over pqxx_pool: try_transaction (or the throwing
//                transaction()) with a queue wait and the call's deadline.
//   (d) pool-many  pqxx_pool alone with many more workers than connections:
//                the workers block in acquire(), up to connection_timeout.
//
// A worker calls arm::call() once per job; the arm says how the call ended
// and when the call itself began and ended (for a rejection: the time the
// arm took to say no, measured around the gate call only).
//
// Thread safety: call() is called concurrently by the workers, each with its
// own index; an arm's connections are used by one worker at a time.
#pragma once

#include "conninfo.hpp"

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <pqxx/pqxx>

#include <sys/resource.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead_bench {

using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// The application_name of every measured connection (the monitor waits for
/// their backends to exit before it reads the server's counters).
inline constexpr const char* bench_application_name = "bulkhead_bench";

/// Rows of the read/write workload's table (and the tpcb workload's accounts).
inline constexpr int account_rows = 10000;
/// Branches and tellers of the tpcb workload. pgbench at scale 1 has one
/// branch, whose row every transaction updates: four clients then queue on
/// one row lock. Eight spread that out, so the comparison measures the
/// client and the protocol rather than one lock.
inline constexpr int branch_rows = 8;
inline constexpr int teller_rows = 80;

// ---------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------

enum class workload : std::uint8_t {
    select1,     ///< SELECT 1 in a transaction
    read_write,  ///< UPDATE one random row of a 10k-row table, SELECT another
    sleep,       ///< SELECT pg_sleep(0.002): the database is the bottleneck
    tpcb,        ///< pgbench's TPC-B-like transaction: three UPDATEs, a SELECT, an INSERT
};

inline constexpr std::array<workload, 4> all_workloads = {workload::select1, workload::read_write, workload::sleep,
                                                          workload::tpcb};

[[nodiscard]] constexpr std::string_view name(workload kind) noexcept {
    switch (kind) {
        case workload::select1:
            return "select1";
        case workload::read_write:
            return "read_write";
        case workload::sleep:
            return "sleep";
        case workload::tpcb:
            return "tpcb";
    }
    return "?";
}

/// Whether the gate may run the workload READ ONLY.
[[nodiscard]] constexpr bool is_read_only(workload kind) noexcept {
    return kind != workload::read_write && kind != workload::tpcb;
}

/// Creates (again) and fills the read/write workload's table.
inline void prepare_database(const std::string& conninfo) {
    pqxx::connection connection(with_field(conninfo, "application_name", bench_application_name));
    {
        pqxx::work tx(connection);
        tx.exec("DROP TABLE IF EXISTS bench_accounts");
        tx.exec("CREATE TABLE bench_accounts (id integer PRIMARY KEY, balance bigint NOT NULL)");
        tx.exec("INSERT INTO bench_accounts SELECT g, 0 FROM generate_series(1, " + std::to_string(account_rows) +
                ") AS g");
        tx.exec("DROP TABLE IF EXISTS bench_branches, bench_tellers, bench_history");
        tx.exec("CREATE TABLE bench_branches (id integer PRIMARY KEY, balance bigint NOT NULL)");
        tx.exec(
            "CREATE TABLE bench_tellers (id integer PRIMARY KEY, branch integer NOT NULL, balance bigint NOT NULL)");
        tx.exec(
            "CREATE TABLE bench_history (teller integer, branch integer, account integer, delta integer, at "
            "timestamp)");
        tx.exec("INSERT INTO bench_branches SELECT g, 0 FROM generate_series(1, " + std::to_string(branch_rows) +
                ") AS g");
        tx.exec("INSERT INTO bench_tellers SELECT g, 1 + g % " + std::to_string(branch_rows) +
                ", 0 FROM generate_series(1, " + std::to_string(teller_rows) + ") AS g");
        tx.commit();
    }
    pqxx::nontransaction tx(connection);
    tx.exec("VACUUM ANALYZE bench_accounts, bench_branches, bench_tellers, bench_history");
}

/// Runs one call's statements in `tx`; returns a value read from the server.
inline long run_statements(pqxx::transaction_base& tx, workload kind, std::mt19937_64& random) {
    switch (kind) {
        case workload::select1:
            return tx.exec("SELECT 1")[0][0].as<long>();
        case workload::read_write: {
            std::uniform_int_distribution<int> row(1, account_rows);
            tx.exec("UPDATE bench_accounts SET balance = balance + 1 WHERE id = " + std::to_string(row(random)));
            return tx.exec("SELECT balance FROM bench_accounts WHERE id = " + std::to_string(row(random)))[0][0]
                .as<long>();
        }
        case workload::sleep:
            (void)tx.exec("SELECT pg_sleep(0.002)");
            return 0;
        case workload::tpcb: {
            // pgbench's built-in script, with its random draws.
            const int account = std::uniform_int_distribution<int>(1, account_rows)(random);
            const int teller = std::uniform_int_distribution<int>(1, teller_rows)(random);
            const int branch = 1 + teller % branch_rows;
            const int delta = std::uniform_int_distribution<int>(-5000, 5000)(random);
            const std::string by = std::to_string(delta);
            tx.exec("UPDATE bench_accounts SET balance = balance + " + by + " WHERE id = " + std::to_string(account));
            const long balance =
                tx.exec("SELECT balance FROM bench_accounts WHERE id = " + std::to_string(account))[0][0].as<long>();
            tx.exec("UPDATE bench_tellers SET balance = balance + " + by + " WHERE id = " + std::to_string(teller));
            tx.exec("UPDATE bench_branches SET balance = balance + " + by + " WHERE id = " + std::to_string(branch));
            tx.exec("INSERT INTO bench_history VALUES (" + std::to_string(teller) + ", " + std::to_string(branch) +
                    ", " + std::to_string(account) + ", " + by + ", CURRENT_TIMESTAMP)");
            return balance;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------

enum class outcome : std::uint8_t {
    completed,        ///< committed (on time or not: judged later against the deadline)
    rejected_full,    ///< refused at once: admission_full
    rejected_wait,    ///< refused after waiting: admission_timeout, deadline_exceeded, pool_timeout
    cut_by_deadline,  ///< started, cut short by the deadline (work_deadline_exceeded), rolled back
    failed,           ///< started and failed otherwise
    unserved,         ///< still queued in the harness when the run ended
};

/// Which entry point of the gate a call used.
enum class api : std::uint8_t {
    try_api,   ///< try_transaction: a rejection is a value
    throwing,  ///< transaction: a rejection is a bulkhead::rejected exception
};

struct call_result {
    outcome what = outcome::completed;
    clock::time_point began{};
    clock::time_point ended{};
    bool preempted = false;  ///< the thread was switched out involuntarily during the call (if tracked)
    bool blocked = false;    ///< the thread slept (a voluntary switch: a lock, a wait) during the call (if tracked)
};

/// Context switches of the calling thread so far (Linux: getrusage(RUSAGE_THREAD);
/// elsewhere always zero).
struct context_switches {
    long involuntary = 0;
    long voluntary = 0;
};

[[nodiscard]] inline context_switches thread_context_switches() noexcept {
#if defined(RUSAGE_THREAD)
    rusage usage{};
    if (::getrusage(RUSAGE_THREAD, &usage) == 0) {
        return {usage.ru_nivcsw, usage.ru_nvcsw};
    }
#endif
    return {};
}

[[nodiscard]] inline outcome classify(bulkhead::reject_reason reason) noexcept {
    return reason == bulkhead::reject_reason::admission_full ? outcome::rejected_full : outcome::rejected_wait;
}

/// Prints the first few unexpected failures (a benchmark must not fail
/// silently) and counts them all.
inline void report_failure(const char* arm, const std::exception& failure) {
    static std::atomic<int> printed{0};
    if (printed.fetch_add(1) < 5) {
        std::fprintf(stderr, "bulkhead_pg_bench: %s: call failed: %s\n", arm, failure.what());
    }
}

// ---------------------------------------------------------------------------
// Arms
// ---------------------------------------------------------------------------

/// What every arm does; see the file comment.
class arm {
public:
    arm() = default;
    arm(const arm&) = delete;
    arm& operator=(const arm&) = delete;
    virtual ~arm() = default;

    /// The arm's name in tables and CSV.
    [[nodiscard]] virtual std::string label() const = 0;
    /// How many workers execute jobs in an open-loop run.
    [[nodiscard]] virtual int workers() const = 0;
    /// One call for the job that should have started at `intended`.
    virtual call_result call(int worker, clock::time_point intended, api which, std::mt19937_64& random) = 0;
};

/// (a) One dedicated connection per worker.
class raw_arm final : public arm {
public:
    raw_arm(const std::string& conninfo, workload kind, int connections) : m_kind(kind) {
        const std::string named = with_field(conninfo, "application_name", bench_application_name);
        for (int i = 0; i < connections; ++i) {
            m_connections.push_back(std::make_unique<pqxx::connection>(named));
        }
    }

    [[nodiscard]] std::string label() const override { return "raw"; }
    [[nodiscard]] int workers() const override { return static_cast<int>(m_connections.size()); }

    call_result call(int worker, clock::time_point /*intended*/, api /*which*/, std::mt19937_64& random) override {
        call_result result{.began = clock::now()};
        try {
            pqxx::work tx(*m_connections[static_cast<std::size_t>(worker)]);
            (void)run_statements(tx, m_kind, random);
            tx.commit();
            result.what = outcome::completed;
        } catch (const std::exception& failure) {
            report_failure("raw", failure);
            result.what = outcome::failed;
        }
        result.ended = clock::now();
        return result;
    }

private:
    workload m_kind;
    std::vector<std::unique_ptr<pqxx::connection>> m_connections;
};

/// Settings of a pool for an arm.
inline bulkhead::pqxx_pool_options pool_settings(const std::string& conninfo, int connections,
                                                 std::chrono::milliseconds connection_timeout) {
    return {.conninfo = conninfo,
            .max_size = static_cast<std::size_t>(connections),
            .min_idle = static_cast<std::size_t>(connections),  // all open before the run starts
            .connection_timeout = connection_timeout,
            .application_name = bench_application_name};
}

/// (b) and (d): the pool alone; `workers` may exceed the connections.
class pool_arm final : public arm {
public:
    pool_arm(const std::string& conninfo, workload kind, int connections, int workers,
             std::chrono::milliseconds connection_timeout)
        : m_kind(kind), m_workers(workers), m_pool(pool_settings(conninfo, connections, connection_timeout)) {}

    [[nodiscard]] std::string label() const override {
        return m_workers > static_cast<int>(m_pool.options().max_size) ? "pool-many" : "pool";
    }
    [[nodiscard]] int workers() const override { return m_workers; }

    call_result call(int /*worker*/, clock::time_point /*intended*/, api /*which*/, std::mt19937_64& random) override {
        call_result result{.began = clock::now()};
        try {
            bulkhead::pqxx_pool::lease lease = m_pool.acquire();
            pqxx::work tx(lease.connection());  // destroyed before the lease
            (void)run_statements(tx, m_kind, random);
            tx.commit();
            result.what = outcome::completed;
        } catch (const bulkhead::rejected& no) {  // pool_timeout
            result.what = classify(no.reason());
        } catch (const std::exception& failure) {
            report_failure("pool", failure);
            result.what = outcome::failed;
        }
        result.ended = clock::now();
        return result;
    }

private:
    workload m_kind;
    int m_workers;
    bulkhead::pqxx_pool m_pool;
};

/// Settings of the gate arm.
struct gate_settings {
    std::string name = "gate";  ///< the arm's name in tables and CSV
    int concurrent = 4;         ///< B, and the pool's size
    int extra_slots = 4;        ///< Q
    std::chrono::nanoseconds queue_wait = 50ms;
    std::chrono::nanoseconds deadline = 100ms;  ///< after the intended start; zero: none
    bool read_only = true;                      ///< for workloads that write nothing
    bool resolve_commit_outcome = true;         ///< the pool's option (read-write only)
    /// The callback takes bulkhead::pqxx_transaction&: BEGIN goes with its
    /// first statement (two round trips for SELECT 1).
    bool deferred_begin = false;
    /// SELECT 1 only: the whole transaction in one round trip (db_bulkhead::execute,
    /// the statement sent with BEGIN and COMMIT).
    bool execute = false;
    bool reset_session = true;        ///< the pool's option: the session reset after every transaction
    bool connection_affinity = true;  ///< the pool's option: a thread gets back the connection it used last
    int workers = 256;                ///< open-loop workers (callers)
    /// Reads the thread's context switches around each call (two system
    /// calls, outside the timed part) to tell a slow rejection from one that
    /// was preempted or slept.
    bool track_preemption = false;
};

/// `options` with the gate arm's choices of the pool's options.
inline bulkhead::pqxx_pool_options with_choices(bulkhead::pqxx_pool_options options, bool reset_session,
                                                bool connection_affinity) {
    options.reset_session = reset_session;
    options.connection_affinity = connection_affinity;
    return options;
}

/// (c) The gate in front of the pool.
class gate_arm final : public arm {
public:
    gate_arm(const std::string& conninfo, workload kind, const gate_settings& settings)
        : m_kind(kind),
          m_settings(settings),
          m_pool(with_choices(pool_settings(conninfo, settings.concurrent, 1000ms), settings.reset_session,
                              settings.connection_affinity)),
          m_gate(m_pool, settings.concurrent, settings.extra_slots) {}

    [[nodiscard]] std::string label() const override { return m_settings.name; }
    [[nodiscard]] int workers() const override { return m_settings.workers; }

    call_result call(int /*worker*/, clock::time_point intended, api which, std::mt19937_64& random) override {
        gate_type::options options{.queue_wait = m_settings.queue_wait,
                                   .transaction = {.read_only = m_settings.read_only,
                                                   .resolve_commit_outcome = m_settings.resolve_commit_outcome}};
        if (m_settings.deadline > m_settings.deadline.zero()) {
            options.deadline = intended + m_settings.deadline;
        }
        const auto work = [&](pqxx::dbtransaction& tx) { return run_statements(tx, m_kind, random); };
        if (m_settings.execute) {
            return call_with(options, which,
                             [](bulkhead::pqxx_transaction& tx) { return tx.exec_with_commit("SELECT 1"); });
        }
        if (m_settings.deferred_begin) {
            return call_with(options, which, [&](bulkhead::pqxx_transaction& tx) {
                if (m_kind == workload::select1) {
                    return tx.exec("SELECT 1")[0][0].as<long>();
                }
                return run_statements(tx.pqxx(), m_kind, random);
            });
        }
        return call_with(options, which, work);
    }

    /// The gate's own counters, for cross-checking the harness's.
    [[nodiscard]] bulkhead::gate_stats stats() const noexcept { return m_gate.stats(); }

private:
    using gate_type = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

    template <class Work>
    call_result call_with(const gate_type::options& options, api which, const Work& work) {
        call_result result;
        const context_switches switches_before =
            m_settings.track_preemption ? thread_context_switches() : context_switches{};
        try {
            if (which == api::try_api) {
                result.began = clock::now();
                const auto answer = m_gate.try_transaction(options, work);
                result.ended = clock::now();
                result.what = answer ? outcome::completed : classify(answer.error());
            } else {
                result.began = clock::now();
                try {
                    (void)m_gate.transaction(options, work);
                    result.ended = clock::now();
                    result.what = outcome::completed;
                } catch (const bulkhead::rejected& no) {
                    result.ended = clock::now();
                    result.what = classify(no.reason());
                }
            }
        } catch (const bulkhead::work_deadline_exceeded&) {
            result.ended = clock::now();
            result.what = outcome::cut_by_deadline;
        } catch (const std::exception& failure) {
            result.ended = clock::now();
            report_failure("gate", failure);
            result.what = outcome::failed;
        }
        if (m_settings.track_preemption) {
            const context_switches switches_after = thread_context_switches();
            result.preempted = switches_after.involuntary != switches_before.involuntary;
            result.blocked = switches_after.voluntary != switches_before.voluntary;
        }
        return result;
    }

    workload m_kind;
    gate_settings m_settings;
    bulkhead::pqxx_pool m_pool;
    gate_type m_gate;
};

}  // namespace bulkhead_bench
