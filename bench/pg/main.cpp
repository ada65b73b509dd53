// bulkhead_pg_bench: the PostgreSQL load harness (docs/performance.md,
// "PostgreSQL load").
//
//   bulkhead_pg_bench [--conninfo CONNINFO] [--prefix PATH] [--quick] [--only PARTS]
//   bulkhead_pg_bench [--conninfo CONNINFO] --profile ARM CALLS [WORKLOAD]
//
// CONNINFO defaults to $BULKHEAD_TEST_DATABASE (scripts/bench starts a
// throwaway server and passes its own). Results go to PATH-*.csv and PATH.md
// (default bench/results/pg-<UTC time>); the summary tables also go to stdout,
// progress to stderr. --quick shortens every run (for trying the harness, not
// for figures). --only runs some parts of the plan, a comma-separated list of
// roundtrips, closed, open, probe, storm, spike, cpu. The whole plan takes
// about five minutes. It drops and recreates the tables bench_accounts,
// bench_branches, bench_tellers and bench_history in the database.
// --profile runs CALLS calls of one arm on one connection, for a profiler:
// SELECT 1, or WORKLOAD (select1, read_write, sleep, tpcb).
//
// The plan, in order:
//   1. round trips: each arm, one connection, sequential calls through a
//      counting relay (wire_counter.hpp): round trips, server transactions
//      (pg_stat_database.xact_commit) and client and server CPU per call;
//      then each arm's SELECT 1 statements sent on a plain connection, to
//      attribute the server CPU;
//   2. closed loop, 4 threads, SELECT 1, the read/write transaction, tpcb
//      and pg_sleep(2 ms), repeated and interleaved (raw, the gate's
//      variants, pool), and pool-many with 64 threads: throughput ratios and
//      the harness's CPU per call;
//   3. the capacity: the gate arm's closed-loop throughput on pg_sleep;
//   4. open loop on pg_sleep at 0.5, 0.8, 1, 2, 4 and 8 times capacity, every
//      arm; the gate at 4x once more with the two-thread rejection probe;
//   5. a spike: 0.5x for 3 s, 4x for 10 s, 0.5x for 5 s (gate and pool-many);
//   6. open loop on SELECT 1 (0.5x and 1x) and read/write (1x and 4x), at
//      their own capacity (gate and pool-many);
//   7. (storm) a retry storm: 200 callers, B = Q = 8, pg_sleep, calling
//      again at once after a rejection, each entry point.
#include "arms.hpp"
#include "conninfo.hpp"
#include "load.hpp"
#include "wire_counter.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace bulkhead_bench {
namespace {

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

struct settings {
    std::string conninfo;
    std::string prefix;
    double scale = 1.0;             ///< every duration is multiplied by it (--quick: 0.25)
    std::vector<std::string> only;  ///< parts to run (--only); empty: all

    [[nodiscard]] bool runs(const std::string& part) const {
        return only.empty() || std::find(only.begin(), only.end(), part) != only.end();
    }

    int concurrent = 4;      ///< B of the gate, the pool size of every arm, the raw arm's connections
    int extra_slots = 4;     ///< Q of the gate
    int many_workers = 256;  ///< open-loop workers of the gate and pool-many arms
    int many_closed = 64;    ///< closed-loop threads of pool-many
    std::chrono::milliseconds queue_wait{50};
    std::chrono::milliseconds deadline{100};                 ///< goodput counts calls completed within it
    std::chrono::milliseconds many_connection_timeout{250};  ///< pool-many: the pool's shortest allowed wait

    [[nodiscard]] std::chrono::nanoseconds seconds(double value) const {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(value * scale * 1e9));
    }
};

// ---------------------------------------------------------------------------
// Output helpers
// ---------------------------------------------------------------------------

[[gnu::format(printf, 1, 2)]] std::string format(const char* pattern, ...) {
    std::va_list arguments;
    va_start(arguments, pattern);
    std::va_list copy;
    va_copy(copy, arguments);
    const int size = std::vsnprintf(nullptr, 0, pattern, copy);
    va_end(copy);
    std::string text(static_cast<std::size_t>(std::max(size, 0)) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), pattern, arguments);
    va_end(arguments);
    text.pop_back();
    return text;
}

double median(std::vector<double> values) {
    if (values.empty()) {
        return std::nan("");
    }
    std::sort(values.begin(), values.end());
    const std::size_t middle = values.size() / 2;
    return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

/// A number for a table: "n/a" for NaN.
std::string number(double value, int decimals) {
    if (std::isnan(value)) {
        return "n/a";
    }
    return format("%.*f", decimals, value);
}

const clock::time_point program_start = clock::now();

[[gnu::format(printf, 1, 2)]] void progress(const char* pattern, ...) {
    std::va_list arguments;
    va_start(arguments, pattern);
    std::fprintf(stderr, "[%6.1f s] ", std::chrono::duration<double>(clock::now() - program_start).count());
    std::vfprintf(stderr, pattern, arguments);
    std::fputc('\n', stderr);
    va_end(arguments);
}

/// Markdown written to PATH.md and stdout at the end.
std::string report;

void line(const std::string& text = {}) {
    report += text;
    report += '\n';
}

// ---------------------------------------------------------------------------
// The server's own counters
// ---------------------------------------------------------------------------

/// Reads pg_stat_database for the benchmark's database from a connection to
/// another database (postgres), so that its own queries do not count.
class server_monitor {
public:
    explicit server_monitor(const std::string& conninfo) {
        {
            pqxx::connection probe(with_field(conninfo, "application_name", bench_application_name));
            pqxx::nontransaction tx(probe);
            m_database = tx.exec("SELECT current_database()")[0][0].as<std::string>();
        }
        try {
            m_connection = std::make_unique<pqxx::connection>(with_field(conninfo, "dbname", "postgres"));
        } catch (const std::exception&) {
            m_connection = std::make_unique<pqxx::connection>(conninfo);
            progress("note: cannot reach database postgres; the monitor's own queries add to the counts");
        }
    }

    /// Transactions committed in the benchmark's database so far (as flushed
    /// by the backends: exact once they have exited).
    [[nodiscard]] std::int64_t committed() {
        pqxx::nontransaction tx(*m_connection);
        return tx.exec("SELECT xact_commit FROM pg_stat_database WHERE datname = " + tx.quote(m_database))[0][0]
            .as<std::int64_t>();
    }

    /// The process id of the harness's one backend; 0 unless there is exactly one.
    [[nodiscard]] long only_backend() {
        pqxx::nontransaction tx(*m_connection);
        const pqxx::result found = tx.exec(std::string("SELECT pid FROM pg_stat_activity WHERE application_name = ") +
                                           tx.quote(bench_application_name));
        return found.size() == 1 ? found[0][0].as<long>() : 0;
    }

    /// Waits until no backend of the harness is left, so that every one of
    /// them has flushed its statistics (backends flush them on exit).
    void wait_for_backends_to_exit() {
        const clock::time_point give_up = clock::now() + 10s;
        while (clock::now() < give_up) {
            pqxx::nontransaction tx(*m_connection);
            const auto left = tx.exec(std::string("SELECT count(*) FROM pg_stat_activity WHERE application_name = ") +
                                      tx.quote(bench_application_name))[0][0]
                                  .as<long>();
            if (left == 0) {
                std::this_thread::sleep_for(20ms);
                return;
            }
            std::this_thread::sleep_for(10ms);
        }
        progress("warning: benchmark backends still present after 10 s; server counts may be short");
    }

private:
    std::string m_database;
    std::unique_ptr<pqxx::connection> m_connection;
};

/// A run's records plus the server transactions it caused.
struct measured {
    run_records records;
    std::int64_t server_transactions = 0;
};

/// Builds the arm (its connections open), reads the server's counter, drives
/// the arm, closes its connections, waits for their backends to exit, reads
/// the counter again.
measured measure(server_monitor& monitor, const std::function<std::unique_ptr<arm>()>& make_arm,
                 const std::function<run_records(arm&)>& drive) {
    std::unique_ptr<arm> target = make_arm();
    const std::int64_t before = monitor.committed();
    measured result{.records = drive(*target)};
    target.reset();
    monitor.wait_for_backends_to_exit();
    result.server_transactions = monitor.committed() - before;
    return result;
}

/// The arm named `which` with `connections` connections (raw), pool size
/// and B (gate), or connections and workers (pool). pool-many always has
/// config.concurrent connections and `workers` threads.
std::unique_ptr<arm> make_arm(const settings& config, const std::string& conninfo, const std::string& which,
                              workload kind, int connections, bool track_preemption = false) {
    if (which == "raw") {
        return std::make_unique<raw_arm>(conninfo, kind, connections);
    }
    if (which == "pool") {
        return std::make_unique<pool_arm>(conninfo, kind, connections, connections, 1000ms);
    }
    if (which == "pool-many") {
        return std::make_unique<pool_arm>(conninfo, kind, config.concurrent, config.many_workers,
                                          config.many_connection_timeout);
    }
    // "gate": read-only where the workload allows, with the call's deadline;
    // "-rw": read-write (the pool's default); "-untracked": with
    // resolve_commit_outcome off; "-nodl": without a deadline (no watchdog,
    // no SET LOCAL statement_timeout); "-execute": the SELECT 1 in one round
    // trip (db_bulkhead::execute); "-noreset": the pool's reset_session off;
    // "-noaffinity": its connection_affinity off.
    // "gate-rw-nodl" is the gate with the pool's default options.
    const auto has = [&](std::string_view part) { return which.find(part) != std::string::npos; };
    gate_settings gate{
        .name = which,
        .concurrent = connections,
        .extra_slots = config.extra_slots,
        .queue_wait = config.queue_wait,
        .deadline = has("-nodl") ? std::chrono::nanoseconds::zero() : std::chrono::nanoseconds(config.deadline),
        .read_only = !has("-rw") && is_read_only(kind),
        .resolve_commit_outcome = !has("-untracked"),
        .execute = has("-execute") && kind == workload::select1,
        .reset_session = !has("-noreset"),
        .connection_affinity = !has("-noaffinity"),
        .workers = config.many_workers,
        .track_preemption = track_preemption};
    return std::make_unique<gate_arm>(conninfo, kind, gate);
}

// ---------------------------------------------------------------------------
// 1. Round trips per call
// ---------------------------------------------------------------------------

struct round_trip_row {
    workload kind;
    std::string arm;
    int calls = 0;
    double round_trips = 0;
    double server_transactions = 0;
    double latency_us = 0;     ///< mean wall time per call (through the relay)
    double client_cpu_us = 0;  ///< CPU time of the calling thread per call
    double server_cpu_us = 0;  ///< CPU time of the connection's backend per call (n/a for a remote server)
};

/// CPU time of the calling thread, in ns.
std::int64_t thread_cpu_ns() {
    timespec now{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

/// CPU time of process `pid` in ns from /proc/PID/schedstat; -1 if unreadable.
std::int64_t process_cpu_ns(long pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/schedstat");
    std::int64_t on_cpu = -1;
    if (!(in >> on_cpu)) {
        return -1;
    }
    return on_cpu;
}

std::vector<round_trip_row> run_round_trips(const settings& config, server_monitor& monitor) {
    std::vector<round_trip_row> rows;
    std::optional<wire_counter> relay;
    try {
        relay.emplace(config.conninfo);
    } catch (const std::exception& failure) {
        progress("round trips: no relay (%s); skipped", failure.what());
        return rows;
    }
    const std::string through = relay->for_clients(config.conninfo);
    const int warm_up = 50;
    const int calls = static_cast<int>(1000 * config.scale);
    const std::vector<std::pair<workload, std::vector<std::string>>> plan = {
        {workload::select1,
         {"raw", "gate", "gate-nodl", "gate-execute", "gate-rw", "gate-rw-nodl", "gate-rw-untracked", "pool"}},
        {workload::read_write, {"raw", "gate", "pool"}},
    };
    // Three interleaved repetitions; the table shows the medians (the counts
    // are exact and the same every time, the CPU times are not).
    std::map<std::pair<workload, std::string>, std::vector<round_trip_row>> samples;
    for (int rep = 0; rep < 3; ++rep) {
        for (const auto& entry : plan) {
            const workload kind = entry.first;  // a plain variable: lambdas below capture it
            for (const std::string& which : entry.second) {
                round_trip_row row{.kind = kind, .arm = which, .calls = calls};
                try {
                    const measured result = measure(
                        monitor, [&] { return make_arm(config, through, which, kind, 1); },
                        [&](arm& target) {
                            std::mt19937_64 random(42);
                            for (int i = 0; i < warm_up; ++i) {
                                (void)target.call(0, clock::now(), api::try_api, random);
                            }
                            const long backend = monitor.only_backend();
                            const std::int64_t server_before = backend > 0 ? process_cpu_ns(backend) : -1;
                            const std::uint64_t wire_before = relay->round_trips();
                            const std::int64_t client_before = thread_cpu_ns();
                            const clock::time_point began = clock::now();
                            for (int i = 0; i < calls; ++i) {
                                (void)target.call(0, clock::now(), api::try_api, random);
                            }
                            const auto elapsed_ns = static_cast<double>(nanoseconds_between(began, clock::now()));
                            row.client_cpu_us = static_cast<double>(thread_cpu_ns() - client_before) / calls / 1e3;
                            row.round_trips = static_cast<double>(relay->round_trips() - wire_before) / calls;
                            row.latency_us = elapsed_ns / calls / 1e3;
                            const std::int64_t server_after = backend > 0 ? process_cpu_ns(backend) : -1;
                            row.server_cpu_us = server_before >= 0 && server_after >= 0
                                                    ? static_cast<double>(server_after - server_before) / calls / 1e3
                                                    : std::nan("");
                            return run_records{};
                        });
                    row.server_transactions = static_cast<double>(result.server_transactions) / (warm_up + calls);
                    samples[{kind, which}].push_back(row);
                } catch (const std::exception& failure) {
                    progress("round trips: %s %s failed: %s", std::string(name(kind)).c_str(), which.c_str(),
                             failure.what());
                }
            }
        }
    }
    for (const auto& [kind, arms] : plan) {
        for (const std::string& which : arms) {
            const std::vector<round_trip_row>& reps = samples[{kind, which}];
            if (reps.empty()) {
                continue;
            }
            const auto median_of = [&](double round_trip_row::*field) {
                std::vector<double> values;
                for (const round_trip_row& sample : reps) {
                    values.push_back(sample.*field);
                }
                return median(values);
            };
            round_trip_row row = reps.front();
            row.round_trips = median_of(&round_trip_row::round_trips);
            row.server_transactions = median_of(&round_trip_row::server_transactions);
            row.latency_us = median_of(&round_trip_row::latency_us);
            row.client_cpu_us = median_of(&round_trip_row::client_cpu_us);
            row.server_cpu_us = median_of(&round_trip_row::server_cpu_us);
            rows.push_back(row);
            progress(
                "round trips: %-10s %-9s %.2f per call, %.3f server xact per call, %.1f us per call, "
                "client CPU %.1f us, server CPU %s us",
                std::string(name(kind)).c_str(), which.c_str(), row.round_trips, row.server_transactions,
                row.latency_us, row.client_cpu_us, number(row.server_cpu_us, 1).c_str());
        }
    }
    return rows;
}

// ---------------------------------------------------------------------------
// 1b. What each statement sequence costs the server
// ---------------------------------------------------------------------------

struct statement_row {
    std::string sequence;
    std::string sent;
    double server_cpu_us;
    double client_cpu_us;
};

/// The SELECT 1 call of each arm, sent as plain statements on one connection
/// (no pool, no gate): the server CPU per call of each sequence, to attribute
/// the difference between the arms. Needs /proc of the server's backend.
constexpr int statement_reps = 7;

/// How a sequence's call ends: its last statement like the others, or the
/// pipelined COMMIT of a transaction that wrote (the id question, a Flush,
/// COMMIT and the reset, one extended-protocol statement each).
enum class commit_tail : std::uint8_t { simple, pipelined };

std::vector<statement_row> run_statement_costs(const settings& config) {
    // The gate's statements as the pool builds them (protocol.hpp), sent as
    // plain simple queries or, for the pipelined COMMIT, through the pool's
    // own pipeline function.
    const std::vector<std::string> commit_steps = bulkhead::detail::reset_steps("COMMIT", "");
    pqxx::connection connection(with_field(config.conninfo, "application_name", bench_application_name));
    const long backend = connection.backendpid();
    if (process_cpu_ns(backend) < 0) {
        progress("statement costs: cannot read the backend's CPU time (remote server?); skipped");
        return {};
    }
    PGconn* const handle = bulkhead::detail::pqxx_compat::native_handle(connection);
    const std::string commit_and_reset = bulkhead::detail::one_query(commit_steps);
    const std::string begin = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY";
    const std::string begin_rw = "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE";
    const std::string question = bulkhead::detail::xact_id_if_assigned(PQserverVersion(handle));
    struct sequence {
        std::string label;
        std::vector<std::string> statements;
        commit_tail tail = commit_tail::simple;
    };
    const std::vector<sequence> sequences = {
        {"raw libpqxx (pqxx::work)", {"BEGIN", "SELECT 1", "COMMIT"}},
        {"gate, read-only, no deadline", {begin, "SELECT 1", commit_and_reset}},
        {"gate, read-only, deadline", {begin + "; SET LOCAL statement_timeout = 99", "SELECT 1", commit_and_reset}},
        {"gate, read-only, no deadline, reset_session = false", {begin, "SELECT 1", "COMMIT"}},
        {"gate, read-write, untracked", {begin_rw, "SELECT 1", commit_and_reset}},
        {"gate, read-write, nothing written: the id question ahead of COMMIT",
         {begin_rw, "SELECT 1", question + "; " + commit_and_reset}},
        {"gate, read-write after a write: the pipelined COMMIT", {begin_rw, "SELECT 1"}, commit_tail::pipelined},
    };
    bool pipelines = false;
#if defined(LIBPQ_HAS_PIPELINING)
    pipelines = bulkhead::detail::pipeline_usable();
#endif
    const int calls = static_cast<int>(2000 * config.scale);
    std::map<std::string, std::vector<double>> server, client;
    pqxx::nontransaction tx(connection);
    const auto one_call = [&](const sequence& each) {
        for (const std::string& statement : each.statements) {
            (void)tx.exec(statement);
        }
#if defined(LIBPQ_HAS_PIPELINING)
        if (each.tail != commit_tail::simple) {
            const auto ignore = [](std::size_t, const PGresult&) noexcept {};
            const auto ignore_head = [](std::size_t, bulkhead::detail::result_ptr&) noexcept {};
            const bulkhead::detail::pipeline_statement asked{question.c_str()};
            if (!bulkhead::detail::run_pipeline(handle, {&asked, 1}, commit_steps, ignore_head, ignore)) {
                throw std::runtime_error("statement costs: the pipelined COMMIT failed");
            }
        }
#endif
    };
    for (int rep = 0; rep < statement_reps; ++rep) {
        for (const sequence& each : sequences) {
            if (each.tail != commit_tail::simple && !pipelines) {
                continue;
            }
            for (int i = 0; i < 100; ++i) {
                one_call(each);
            }
            const std::int64_t server_before = process_cpu_ns(backend);
            const std::int64_t client_before = thread_cpu_ns();
            for (int i = 0; i < calls; ++i) {
                one_call(each);
            }
            server[each.label].push_back(static_cast<double>(process_cpu_ns(backend) - server_before) / calls / 1e3);
            client[each.label].push_back(static_cast<double>(thread_cpu_ns() - client_before) / calls / 1e3);
        }
    }
    std::vector<statement_row> rows;
    for (const auto& [label, statements, tail] : sequences) {
        if (server[label].empty()) {
            continue;
        }
        std::string sent;
        for (const std::string& statement : statements) {
            sent += (sent.empty() ? "`" : " / `") + statement + "`";
        }
        if (tail != commit_tail::simple) {
            sent += " / pipeline: `" + question + "`, Flush, `COMMIT`, the reset's statements, Sync";
        }
        rows.push_back({label, sent, median(server[label]), median(client[label])});
        progress("statement costs: %-55s server CPU %.1f us per call", label.c_str(), rows.back().server_cpu_us);
    }
    return rows;
}

// ---------------------------------------------------------------------------
// 2. and 3. Closed loop
// ---------------------------------------------------------------------------

struct closed_row {
    workload kind;
    std::string arm;
    int threads;
    int rep;
    double seconds;
    std::uint64_t calls;
    double throughput;
    double p50_ms, p99_ms, p999_ms;
    std::int64_t server_transactions;
    double server_per_call;
    double server_tps;
    double client_cpu_us;  ///< the harness process's CPU time per call (every thread, the gate and pool included)
};

/// CPU time of the whole process so far, in ns.
std::int64_t own_process_cpu_ns() {
    timespec now{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

closed_row run_closed(const settings& config, server_monitor& monitor, workload kind, const std::string& which,
                      int threads, int rep, double seconds) {
    // Counted: calls that end inside the window, after a warm-up.
    const std::chrono::nanoseconds window = config.seconds(seconds);
    const std::chrono::nanoseconds warm_up = config.seconds(0.25);
    std::int64_t cpu_ns = 0;
    const measured result = measure(
        monitor, [&] { return make_arm(config, config.conninfo, which, kind, threads); },
        [&](arm& target) {
            const std::int64_t cpu_before = own_process_cpu_ns();
            run_records records =
                run_closed_loop(target, threads, warm_up + window, static_cast<std::uint64_t>(rep) * 1000U + 17U);
            cpu_ns = own_process_cpu_ns() - cpu_before;
            return records;
        });
    std::vector<std::int64_t> latencies;
    std::uint64_t completed = 0;
    std::uint64_t reached = 0;
    for (const record& call : result.records.calls) {
        if (started_work(call.what)) {
            ++reached;
        }
        const std::int64_t ended = call.began_ns + call.call_ns;
        if (call.what == outcome::completed && ended > warm_up.count() && ended <= (warm_up + window).count()) {
            ++completed;
            latencies.push_back(call.call_ns);
        }
    }
    closed_row row{
        .kind = kind,
        .arm = which,
        .threads = threads,
        .rep = rep,
        .seconds = std::chrono::duration<double>(window).count(),
        .calls = completed,
        .throughput = static_cast<double>(completed) / std::chrono::duration<double>(window).count(),
        .p50_ms = quantile(latencies, 0.50) / 1e6,
        .p99_ms = quantile(latencies, 0.99) / 1e6,
        .p999_ms = quantile(latencies, 0.999) / 1e6,
        .server_transactions = result.server_transactions,
        .server_per_call = reached == 0
                               ? std::nan("")
                               : static_cast<double>(result.server_transactions) / static_cast<double>(reached),
        .server_tps = static_cast<double>(result.server_transactions) / result.records.wall_s,
        .client_cpu_us = result.records.calls.empty()
                             ? std::nan("")
                             : static_cast<double>(cpu_ns) / static_cast<double>(result.records.calls.size()) / 1e3};
    progress(
        "closed %-10s %-17s x%-3d rep %d: %8.0f calls/s  p50 %.3f ms  p99 %.3f ms  %.2f server xact/call  client "
        "CPU %.1f us/call",
        std::string(name(kind)).c_str(), which.c_str(), threads, rep, row.throughput, row.p50_ms, row.p99_ms,
        row.server_per_call, row.client_cpu_us);
    return row;
}

// ---------------------------------------------------------------------------
// 4. to 6. Open loop
// ---------------------------------------------------------------------------

struct open_row {
    workload kind;
    std::string arm;
    double load;  ///< times capacity
    double capacity;
    double offered_rate;
    run_summary summary;
    std::int64_t server_transactions;
    double server_per_call;
    double server_tps;
    bool probe = false;
};

struct open_result {
    open_row row;
    run_records records;
};

/// An open-loop run through `phases`. With a warm-up, the first phase's rate
/// runs that much longer first, and the figures leave those calls out.
open_result run_open(const settings& config, server_monitor& monitor, workload kind, const std::string& which,
                     double load, double capacity, std::vector<phase> phases, std::uint64_t seed,
                     std::chrono::nanoseconds warm_up, bool probe = false) {
    if (warm_up > warm_up.zero()) {
        phases.insert(phases.begin(), phase{warm_up, phases.front().rate});
    }
    open_loop_plan plan;
    for (const phase& stretch : phases) {
        plan.window += stretch.length;
    }
    plan.arrivals_ns = poisson_arrivals(phases, seed);
    plan.seed = seed;
    plan.probe = probe;
    measured result = measure(
        monitor, [&] { return make_arm(config, config.conninfo, which, kind, config.concurrent, true); },
        [&](arm& target) { return run_open_loop(target, plan); });
    const double window_s = std::chrono::duration<double>(plan.window - warm_up).count();
    result.records.window_s = window_s;
    open_row row{.kind = kind,
                 .arm = which,
                 .load = load,
                 .capacity = capacity,
                 .offered_rate = 0,
                 .summary = summarize(result.records.calls, config.deadline, window_s, warm_up.count()),
                 .server_transactions = result.server_transactions,
                 .server_per_call = 0,
                 .server_tps = static_cast<double>(result.server_transactions) / result.records.wall_s,
                 .probe = probe};
    row.offered_rate = static_cast<double>(row.summary.offered) / window_s;
    std::uint64_t reached = summarize(result.records.calls, config.deadline, window_s).reached_database;
    for (const record& call : result.records.probe) {
        reached += started_work(call.what) ? 1U : 0U;
    }
    row.server_per_call =
        reached == 0 ? std::nan("") : static_cast<double>(result.server_transactions) / static_cast<double>(reached);
    const run_summary& s = row.summary;
    progress(
        "open %-10s %-9s %4.1fx%s: offered %6.0f/s goodput %6.0f/s  p99 %7.2f ms  rej %5.1f%%  timeout %5.1f%%  "
        "rej p99 %.1f us  lag p99 %.2f ms",
        std::string(name(kind)).c_str(), which.c_str(), load, probe ? " +probe" : "", row.offered_rate, s.goodput,
        s.admitted_p99_ms, 100 * s.share(s.rejected_full + s.rejected_wait), 100 * s.share(s.late + s.cut + s.unserved),
        s.rejection_p99_us, s.pickup_p99_ms);
    return {row, std::move(result.records)};
}

// ---------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------

class csv_file {
public:
    csv_file(const std::string& path, const std::string& header) : m_out(path) {
        if (!m_out) {
            throw std::runtime_error("cannot write " + path);
        }
        m_out << header << '\n';
    }
    void row(const std::string& text) { m_out << text << '\n'; }

private:
    std::ofstream m_out;
};

std::string open_csv_row(const open_row& row) {
    const run_summary& s = row.summary;
    return format(
        "%s,%s,%.2f,%.1f,%.1f,%.3f,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%.1f,%.1f,%.4f,%.4f,%.4f,%.3f,%.3f,"
        "%.3f,%.3f,%.3f,%.3f,%.3f,%lld,%.3f,%.1f,%.4f,%.4f,%d",
        std::string(name(row.kind)).c_str(), row.arm.c_str(), row.load, row.capacity, row.offered_rate,
        s.offered == 0 ? 0.0 : static_cast<double>(s.offered) / row.offered_rate,
        static_cast<unsigned long long>(s.offered), static_cast<unsigned long long>(s.on_time),
        static_cast<unsigned long long>(s.late), static_cast<unsigned long long>(s.rejected_full),
        static_cast<unsigned long long>(s.rejected_wait), static_cast<unsigned long long>(s.cut),
        static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(s.unserved), s.goodput, s.throughput,
        s.admitted_p50_ms, s.admitted_p99_ms, s.admitted_p999_ms, s.rejection_p50_us, s.rejection_p99_us,
        s.full_try_p50_us, s.full_try_p99_us, s.full_throw_p50_us, s.full_throw_p99_us, s.pickup_p99_ms,
        static_cast<long long>(row.server_transactions), row.server_per_call, row.server_tps,
        s.share(s.rejected_full + s.rejected_wait), s.share(s.late + s.cut + s.unserved), row.probe ? 1 : 0);
}

constexpr const char* open_csv_header =
    "workload,arm,load,capacity,offered_rate,seconds,offered,on_time,late,rejected_full,rejected_wait,cut,failed,"
    "unserved,goodput,throughput,admitted_p50_ms,admitted_p99_ms,admitted_p999_ms,rejection_p50_us,"
    "rejection_p99_us,full_try_p50_us,full_try_p99_us,full_throw_p50_us,full_throw_p99_us,pickup_p99_ms,"
    "server_xact,server_xact_per_call,server_tps,rejected_share,timeout_share,probe";

// ---------------------------------------------------------------------------
// Rejection latencies: the overload run and the probe
// ---------------------------------------------------------------------------

struct rejection_row {
    std::string run;
    std::string api_name;
    int threads_at_once;
    std::uint64_t count;
    double p50_us, p99_us, p999_us, max_us;
    double preempted_share;     ///< rejections during which the thread was preempted
    double blocked_share;       ///< rejections during which the thread slept (a lock)
    double p99_unpreempted_us;  ///< p99 of the others (neither)
    double overlap_share;       ///< probe: share of rounds whose two bursts overlapped in time
};

/// Rejection times of `which` in `calls`. With threads == 2 (the probe), only
/// the calls made while the other probe thread's burst of the same round was
/// running count: two threads rejecting at once.
rejection_row rejection_figures(const std::vector<record>& calls, api which, const std::string& run, int threads) {
    // Per probe round, the span of each thread's burst.
    struct span {
        std::int64_t from = INT64_MAX;
        std::int64_t to = INT64_MIN;
    };
    std::map<std::int64_t, std::array<span, 2>> rounds;
    if (threads == 2) {
        for (const record& call : calls) {
            if (call.which == which) {
                span& mine = rounds[call.round][call.slot];
                mine.from = std::min(mine.from, call.began_ns);
                mine.to = std::max(mine.to, call.began_ns + call.call_ns);
            }
        }
    }
    const auto at_once = [&](const record& call) {
        if (threads != 2) {
            return true;
        }
        const std::array<span, 2>& pair = rounds[call.round];
        const span& other = pair[1U - call.slot];
        return call.began_ns >= other.from && call.began_ns + call.call_ns <= other.to;
    };
    std::vector<std::int64_t> times;
    std::vector<std::int64_t> undisturbed;
    std::uint64_t preempted = 0;
    std::uint64_t blocked = 0;
    for (const record& call : calls) {
        if (call.what == outcome::rejected_full && call.which == which && at_once(call)) {
            times.push_back(call.call_ns);
            preempted += call.preempted ? 1U : 0U;
            blocked += call.blocked ? 1U : 0U;
            if (!call.preempted && !call.blocked) {
                undisturbed.push_back(call.call_ns);
            }
        }
    }
    const auto share_of = [&](std::uint64_t part) {
        return times.empty() ? std::nan("") : static_cast<double>(part) / static_cast<double>(times.size());
    };
    rejection_row row{.run = run,
                      .api_name = which == api::try_api ? "try_transaction" : "transaction (throws)",
                      .threads_at_once = threads,
                      .count = times.size(),
                      .p50_us = quantile(times, 0.5) / 1e3,
                      .p99_us = quantile(times, 0.99) / 1e3,
                      .p999_us = quantile(times, 0.999) / 1e3,
                      .max_us = times.empty() ? std::nan("") : static_cast<double>(times.back()) / 1e3,
                      .preempted_share = share_of(preempted),
                      .blocked_share = share_of(blocked),
                      .p99_unpreempted_us = quantile(undisturbed, 0.99) / 1e3,
                      .overlap_share = std::nan("")};
    if (threads == 2) {
        std::uint64_t overlapping = 0;
        for (const auto& [round, pair] : rounds) {
            if (pair[0].from < pair[1].to && pair[1].from < pair[0].to) {
                ++overlapping;
            }
        }
        row.overlap_share =
            rounds.empty() ? std::nan("") : static_cast<double>(overlapping) / static_cast<double>(rounds.size());
    }
    return row;
}

// ---------------------------------------------------------------------------
// A retry storm: callers that retry at once after a rejection
// ---------------------------------------------------------------------------

struct storm_row {
    std::string api_name;
    int rep = 0;
    double admitted_per_s = 0;  ///< calls completed in the window, per second
    double rejected_per_s = 0;  ///< admission_full rejections in the window, per second
    double admitted_p99_ms = 0;
    rejection_row rejections;
};

constexpr int storm_threads = 200;
constexpr int storm_slots = 8;  ///< B, Q and the pool's size

/// `storm_threads` threads in a closed loop on pg_sleep(2 ms) through a gate
/// with B = Q = storm_slots, each calling again at once after a rejection, for
/// each entry point; two interleaved repetitions of each. First, as the
/// baseline, B + Q threads on the same gate: nobody is rejected.
std::vector<storm_row> run_storm(const settings& config, server_monitor& monitor) {
    std::vector<storm_row> rows;
    const std::chrono::nanoseconds window = config.seconds(3.0);
    const std::chrono::nanoseconds warm_up = config.seconds(0.5);
    for (int rep = 0; rep <= 2; ++rep) {
        for (const api which : {api::try_api, api::throwing}) {
            if (rep == 0 && which == api::throwing) {
                continue;
            }
            const int callers = rep == 0 ? 2 * storm_slots : storm_threads;
            const measured result = measure(
                monitor,
                [&]() -> std::unique_ptr<arm> {
                    return std::make_unique<gate_arm>(config.conninfo, workload::sleep,
                                                      gate_settings{.name = "gate",
                                                                    .concurrent = storm_slots,
                                                                    .extra_slots = storm_slots,
                                                                    .queue_wait = config.queue_wait,
                                                                    .deadline = std::chrono::nanoseconds::zero(),
                                                                    .track_preemption = true});
                },
                [&](arm& target) {
                    return run_closed_loop(target, callers, warm_up + window, static_cast<std::uint64_t>(rep) * 7919U,
                                           which);
                });
            std::vector<record> counted;
            std::vector<std::int64_t> admitted;
            std::uint64_t rejected = 0;
            for (const record& call : result.records.calls) {
                const std::int64_t ended = call.began_ns + call.call_ns;
                if (ended <= warm_up.count() || ended > (warm_up + window).count()) {
                    continue;
                }
                counted.push_back(call);
                if (call.what == outcome::completed) {
                    admitted.push_back(call.call_ns);
                } else if (call.what == outcome::rejected_full) {
                    ++rejected;
                }
            }
            const double seconds = std::chrono::duration<double>(window).count();
            std::string api_name = which == api::try_api ? "try_transaction" : "transaction (throws)";
            if (rep == 0) {
                api_name += format(", %d callers: no storm (baseline)", callers);
            }
            storm_row row{.api_name = api_name,
                          .rep = rep,
                          .admitted_per_s = static_cast<double>(admitted.size()) / seconds,
                          .rejected_per_s = static_cast<double>(rejected) / seconds,
                          .admitted_p99_ms = quantile(admitted, 0.99) / 1e6,
                          .rejections = rejection_figures(
                              counted, which, format("retry storm, B = Q = %d, pg_sleep", storm_slots), callers)};
            progress("storm %-20s rep %d: admitted %.0f/s, rejected %.0f/s, rejection p50 %.2f us p99 %.2f us",
                     row.api_name.c_str(), rep, row.admitted_per_s, row.rejected_per_s, row.rejections.p50_us,
                     row.rejections.p99_us);
            rows.push_back(std::move(row));
        }
    }
    return rows;
}

// ---------------------------------------------------------------------------
// Rejections from idle callers, cold and warm (no database work)
// ---------------------------------------------------------------------------

/// 256 callers, each rejected about every 40 ms (about 6,400 rejections/s in
/// all, as at 4x in the pg_sleep runs) by a gate whose B + Q slots are held,
/// and each rejected a second time at once: the first call finds the
/// rejection path cold (the thread slept), the second finds it warm. Half
/// the callers use try_transaction, half transaction(). Nothing reaches the
/// server.
std::vector<rejection_row> run_idle_rejections(const settings& config) {
    bulkhead::pqxx_pool pool({.conninfo = config.conninfo,
                              .max_size = static_cast<std::size_t>(config.concurrent),
                              .application_name = bench_application_name});
    bulkhead::db_bulkhead<bulkhead::pqxx_pool> gate(pool, config.concurrent, config.extra_slots);
    // Fill the gate: B holders with permits, Q more waiting (they hold slots).
    std::atomic<bool> done{false};
    std::vector<std::thread> holders;
    for (int i = 0; i < config.concurrent + config.extra_slots; ++i) {
        holders.emplace_back([&] {
            const bulkhead::permit held = gate.enter({.queue_wait = 600s});
            while (!done.load()) {
                std::this_thread::sleep_for(5ms);
            }
        });
    }
    while (gate.available_slots() > 0) {
        std::this_thread::sleep_for(1ms);
    }
    const int callers = config.many_workers;
    const std::chrono::nanoseconds window = config.seconds(3.0);
    std::vector<std::vector<record>> per_caller(static_cast<std::size_t>(callers));
    std::vector<std::thread> threads;
    const clock::time_point start = clock::now();
    for (int index = 0; index < callers; ++index) {
        threads.emplace_back([&, index] {
            std::mt19937_64 random(static_cast<std::uint64_t>(index) + 99U);
            std::exponential_distribution<double> pause(25.0);  // per second: one every 40 ms
            const api which = index % 2 == 0 ? api::try_api : api::throwing;
            const auto work = [](pqxx::dbtransaction&) { return 0; };
            std::vector<record>& out = per_caller[static_cast<std::size_t>(index)];
            out.reserve(256);
            while (clock::now() - start < window) {
                std::this_thread::sleep_for(std::chrono::duration<double>(pause(random)));
                for (std::int64_t attempt = 0; attempt < 2; ++attempt) {
                    const context_switches before = thread_context_switches();
                    const clock::time_point began = clock::now();
                    bool refused = false;
                    if (which == api::try_api) {
                        refused = !gate.try_transaction({.queue_wait = config.queue_wait}, work);
                    } else {
                        try {
                            (void)gate.transaction({.queue_wait = config.queue_wait}, work);
                        } catch (const bulkhead::rejected&) {
                            refused = true;
                        }
                    }
                    const clock::time_point ended = clock::now();
                    const context_switches after = thread_context_switches();
                    out.push_back({.call_ns = nanoseconds_between(began, ended),
                                   .round = attempt,
                                   .what = refused ? outcome::rejected_full : outcome::completed,
                                   .which = which,
                                   .preempted = after.involuntary != before.involuntary,
                                   .blocked = after.voluntary != before.voluntary});
                }
            }
        });
    }
    for (std::thread& thread : threads) {
        thread.join();
    }
    done.store(true);
    for (std::thread& holder : holders) {
        holder.join();
    }
    std::vector<record> first, second;
    for (const std::vector<record>& part : per_caller) {
        for (const record& call : part) {
            (call.round == 0 ? first : second).push_back(call);
        }
    }
    std::vector<rejection_row> rows;
    for (const api which : {api::try_api, api::throwing}) {
        rows.push_back(rejection_figures(first, which, "idle callers, no database work: first call after ~40 ms", 1));
        rows.push_back(
            rejection_figures(second, which, "idle callers, no database work: the same call again at once", 1));
    }
    progress("idle rejections: first call p99 %.2f us (try) / %.2f us (throws); again at once %.2f / %.2f us",
             rows[0].p99_us, rows[2].p99_us, rows[1].p99_us, rows[3].p99_us);
    return rows;
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

const open_row* find_open(const std::vector<open_row>& rows, workload kind, const std::string& which, double load) {
    for (const open_row& row : rows) {
        if (row.kind == kind && row.arm == which && std::abs(row.load - load) < 1e-6 && !row.probe) {
            return &row;
        }
    }
    return nullptr;
}

/// Sorts `rows` (pointers into one vector, in its order) by `less`; rows that
/// compare equal keep their order, the order they ran in. std::sort with the
/// address as the last key rather than std::stable_sort: with libstdc++ 12
/// (Debian 12) in C++20, clang warns (-Wdeprecated-declarations) on the
/// std::get_temporary_buffer that stable_sort calls inside libstdc++.
template <class Less>
void sort_in_run_order(std::vector<const open_row*>& rows, Less less) {
    std::sort(rows.begin(), rows.end(), [&](const open_row* a, const open_row* b) {
        if (less(*a, *b)) {
            return true;
        }
        if (less(*b, *a)) {
            return false;
        }
        return std::less<>{}(a, b);
    });
}

void open_table(const std::vector<open_row>& rows, workload kind) {
    line(
        "| load | arm | offered/s | goodput/s | admitted p50 ms | p99 ms | p99.9 ms | rejection p50 µs | p99 µs | "
        "rejected | of which after a wait | timed out | server tps | server xact/call | dispatch lag p99 ms |");
    line("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    std::vector<const open_row*> selected;
    for (const open_row& row : rows) {
        if (row.kind == kind && !row.probe) {
            selected.push_back(&row);
        }
    }
    sort_in_run_order(selected, [](const open_row& a, const open_row& b) { return a.load < b.load; });
    for (const open_row* row : selected) {
        const run_summary& s = row->summary;
        line(format(
            "| %.1fx | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %.1f %% | %.1f %% | %.1f %% | %.0f | %s | %s |",
            row->load, row->arm.c_str(), row->offered_rate, s.goodput, number(s.admitted_p50_ms, 2).c_str(),
            number(s.admitted_p99_ms, 2).c_str(), number(s.admitted_p999_ms, 2).c_str(),
            number(s.rejection_p50_us, 2).c_str(), number(s.rejection_p99_us, 2).c_str(),
            100 * s.share(s.rejected_full + s.rejected_wait), 100 * s.share(s.rejected_wait),
            100 * s.share(s.late + s.cut + s.unserved), row->server_tps, number(row->server_per_call, 2).c_str(),
            number(s.pickup_p99_ms, 2).c_str()));
    }
}

std::string verdict(bool met) { return met ? "**met**" : "**missed**"; }

// ---------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------

/// The first line of /proc/loadavg (or "n/a").
std::string load_average() {
    std::ifstream in("/proc/loadavg");
    std::string one, five, fifteen;
    if (!(in >> one >> five >> fifteen)) {
        return "n/a";
    }
    return one + " " + five + " " + fifteen;
}

/// "model name" from /proc/cpuinfo (or "n/a").
std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string text; std::getline(in, text);) {
        if (text.rfind("model name", 0) == 0) {
            const std::size_t colon = text.find(':');
            return colon == std::string::npos ? text : text.substr(colon + 2);
        }
    }
    return "n/a";
}

int run(const settings& config) {
    progress("preparing the database (bench_accounts, %d rows)", account_rows);
    prepare_database(config.conninfo);
    server_monitor monitor(config.conninfo);
    std::string server_version;
    {
        pqxx::connection connection(with_field(config.conninfo, "application_name", bench_application_name));
        pqxx::nontransaction tx(connection);
        server_version = tx.exec("SHOW server_version")[0][0].as<std::string>();
    }
    monitor.wait_for_backends_to_exit();  // the setup's transactions must not count in the first run
    const std::string load_before = load_average();
    const auto started = std::chrono::system_clock::now();

    // 1. Round trips.
    std::vector<round_trip_row> round_trips;
    std::vector<statement_row> statement_costs;
    if (config.runs("roundtrips")) {
        round_trips = run_round_trips(config, monitor);
        statement_costs = run_statement_costs(config);
        monitor.wait_for_backends_to_exit();  // its counts must not land in the next run's
    }

    // 2. Closed loop, SELECT 1 and read/write, interleaved repetitions.
    std::vector<closed_row> closed;
    const int threads = config.concurrent;
    if (config.runs("closed")) {
        // Short runs, many repetitions, arms interleaved: each ratio compares
        // neighbouring runs, which a shared machine's drift affects alike.
        for (int rep = 1; rep <= 5; ++rep) {
            for (const char* which : {"raw", "gate", "gate-nodl", "gate-execute", "gate-rw", "gate-rw-nodl",
                                      "gate-rw-untracked", "gate-rw-nodl-noreset", "gate-rw-nodl-noaffinity", "pool"}) {
                closed.push_back(run_closed(config, monitor, workload::select1, which, threads, rep, 1.25));
            }
        }
        closed.push_back(run_closed(config, monitor, workload::select1, "pool-many", config.many_closed, 1, 2.0));
        for (int rep = 1; rep <= 4; ++rep) {
            for (const char* which : {"raw", "gate", "pool"}) {
                closed.push_back(run_closed(config, monitor, workload::read_write, which, threads, rep, 1.25));
            }
        }
        closed.push_back(run_closed(config, monitor, workload::read_write, "pool-many", config.many_closed, 1, 2.0));
        for (int rep = 1; rep <= 4; ++rep) {
            for (const char* which : {"raw", "gate-rw", "gate-rw-nodl", "gate-rw-untracked", "gate-rw-nodl-noreset",
                                      "gate-rw-nodl-noaffinity"}) {
                closed.push_back(run_closed(config, monitor, workload::tpcb, which, threads, rep, 1.25));
            }
        }
        for (int rep = 1; rep <= 3; ++rep) {
            for (const char* which : {"raw", "gate", "gate-rw-nodl", "pool"}) {
                closed.push_back(run_closed(config, monitor, workload::sleep, which, threads, rep, 1.5));
            }
        }
        closed.push_back(run_closed(config, monitor, workload::sleep, "pool-many", config.many_closed, 1, 2.0));
    }

    // 3. Capacity: the gate arm's closed-loop throughput with B threads
    // (measured here when the closed-loop part did not).
    const auto capacity_of = [&](workload kind) {
        std::vector<double> values;
        for (const closed_row& row : closed) {
            if (row.kind == kind && row.arm == "gate") {
                values.push_back(row.throughput);
            }
        }
        if (values.empty()) {
            closed.push_back(run_closed(config, monitor, kind, "gate", threads, 1, 2.0));
            values.push_back(closed.back().throughput);
        }
        return median(values);
    };
    const double capacity = capacity_of(workload::sleep);
    progress("capacity on pg_sleep(2 ms) with B = %d: %.0f calls/s", config.concurrent, capacity);

    // 4. Open loop on pg_sleep, arms interleaved at each load.
    std::vector<open_row> open;
    std::vector<rejection_row> rejections;
    const std::chrono::nanoseconds warm_up = config.seconds(0.5);
    std::vector<double> loads = {0.5, 0.8, 1.0, 2.0, 4.0, 8.0};
    if (!config.runs("open")) {
        loads.clear();
    }
    std::uint64_t seed = 1;
    for (const double load : loads) {
        for (const char* which : {"gate", "pool-many", "raw", "pool"}) {
            open_result result = run_open(config, monitor, workload::sleep, which, load, capacity,
                                          {{config.seconds(2.5), load * capacity}}, seed++, warm_up);
            if (std::string(which) == "gate" && std::abs(load - 4.0) < 1e-6) {
                rejections.push_back(
                    rejection_figures(result.records.calls, api::try_api, "pg_sleep 4x, 256 callers", 1));
                rejections.push_back(
                    rejection_figures(result.records.calls, api::throwing, "pg_sleep 4x, 256 callers", 1));
            }
            open.push_back(std::move(result.row));
        }
    }
    if (config.runs("probe")) {
        open_result result = run_open(config, monitor, workload::sleep, "gate", 4.0, capacity,
                                      {{config.seconds(3.0), 4.0 * capacity}}, seed++, warm_up, /*probe=*/true);
        rejections.push_back(rejection_figures(result.records.probe, api::try_api, "pg_sleep 4x, probe", 2));
        rejections.push_back(rejection_figures(result.records.probe, api::throwing, "pg_sleep 4x, probe", 2));
        open.push_back(std::move(result.row));
    }

    if (config.runs("probe")) {
        for (rejection_row& row : run_idle_rejections(config)) {
            rejections.push_back(std::move(row));
        }
    }
    std::vector<storm_row> storm;
    if (config.runs("storm")) {
        storm = run_storm(config, monitor);
        for (const storm_row& row : storm) {
            if (row.rep > 0) {
                rejections.push_back(row.rejections);
            }
        }
    }

    // 5. The spike.
    struct spike_series {
        std::string arm;
        std::vector<record> calls;
    };
    std::vector<spike_series> spikes;
    const std::vector<phase> spike_phases = {{config.seconds(3.0), 0.5 * capacity},
                                             {config.seconds(10.0), 4.0 * capacity},
                                             {config.seconds(5.0), 0.5 * capacity}};
    for (const char* which : {"gate", "pool-many"}) {
        if (!config.runs("spike")) {
            break;
        }
        open_result result = run_open(config, monitor, workload::sleep, which, 4.0, capacity, spike_phases, seed++,
                                      std::chrono::nanoseconds::zero());
        spikes.push_back({which, std::move(result.records.calls)});
    }

    // 6. Open loop on the CPU-bound workloads, at their own capacity.
    std::map<workload, double> capacities{{workload::sleep, capacity}};
    for (const workload kind : {workload::select1, workload::read_write}) {
        if (!config.runs("cpu")) {
            break;
        }
        capacities[kind] = capacity_of(kind);
        // The harness hands every arrival to a worker thread (about 10 µs of
        // CPU each): 4x SELECT 1 (about 90,000 arrivals/s) is more than two
        // shared cores can dispatch, so SELECT 1 stops at 1x.
        const std::vector<double> cpu_loads =
            kind == workload::select1 ? std::vector<double>{0.5, 1.0} : std::vector<double>{1.0, 4.0};
        for (const double load : cpu_loads) {
            for (const char* which : {"gate", "pool-many"}) {
                open.push_back(run_open(config, monitor, kind, which, load, capacities[kind],
                                        {{config.seconds(2.0), load * capacities[kind]}}, seed++, warm_up)
                                   .row);
            }
        }
    }

    // --- CSV ------------------------------------------------------------------
    {
        csv_file file(config.prefix + "-roundtrips.csv",
                      "workload,arm,calls,round_trips_per_call,server_xact_per_call,latency_us,client_cpu_us,"
                      "server_cpu_us");
        for (const round_trip_row& row : round_trips) {
            file.row(format("%s,%s,%d,%.3f,%.3f,%.2f,%.2f,%.2f", std::string(name(row.kind)).c_str(), row.arm.c_str(),
                            row.calls, row.round_trips, row.server_transactions, row.latency_us, row.client_cpu_us,
                            row.server_cpu_us));
        }
    }
    {
        csv_file file(config.prefix + "-closed.csv",
                      "workload,arm,threads,rep,seconds,calls,throughput,p50_ms,p99_ms,p999_ms,server_xact,"
                      "server_xact_per_call,server_tps,client_cpu_us_per_call");
        for (const closed_row& row : closed) {
            file.row(format("%s,%s,%d,%d,%.3f,%llu,%.1f,%.4f,%.4f,%.4f,%lld,%.3f,%.1f,%.2f",
                            std::string(name(row.kind)).c_str(), row.arm.c_str(), row.threads, row.rep, row.seconds,
                            static_cast<unsigned long long>(row.calls), row.throughput, row.p50_ms, row.p99_ms,
                            row.p999_ms, static_cast<long long>(row.server_transactions), row.server_per_call,
                            row.server_tps, row.client_cpu_us));
        }
    }
    {
        // Sorted by workload, arm, load: gnuplot draws one line per arm.
        std::vector<const open_row*> sorted;
        for (const open_row& row : open) {
            sorted.push_back(&row);
        }
        sort_in_run_order(sorted, [](const open_row& a, const open_row& b) {
            return std::tie(a.kind, a.probe, a.arm, a.load) < std::tie(b.kind, b.probe, b.arm, b.load);
        });
        csv_file file(config.prefix + "-open.csv", open_csv_header);
        for (const open_row* row : sorted) {
            file.row(open_csv_row(*row));
        }
    }
    const std::int64_t bucket_ns = std::max<std::int64_t>(config.seconds(0.5).count(), 1);
    {
        csv_file file(config.prefix + "-spike.csv",
                      "arm,t_s,offered_rate,goodput,rejected_rate,timed_out_rate,admitted_p99_ms");
        for (const spike_series& series : spikes) {
            std::int64_t end = 0;
            for (const phase& stretch : spike_phases) {
                end += stretch.length.count();
            }
            for (std::int64_t from = 0; from < end; from += bucket_ns) {
                const double seconds = static_cast<double>(bucket_ns) / 1e9;
                const run_summary s = summarize(series.calls, config.deadline, seconds, from, from + bucket_ns);
                file.row(format("%s,%.2f,%.1f,%.1f,%.1f,%.1f,%.3f", series.arm.c_str(),
                                (static_cast<double>(from) + static_cast<double>(bucket_ns) / 2) / 1e9,
                                static_cast<double>(s.offered) / seconds, s.goodput,
                                static_cast<double>(s.rejected_full + s.rejected_wait) / seconds,
                                static_cast<double>(s.late + s.cut + s.unserved) / seconds, s.admitted_p99_ms));
            }
        }
    }
    {
        csv_file file(config.prefix + "-rejections.csv",
                      "run,api,threads_at_once,count,p50_us,p99_us,p999_us,max_us,preempted_share,"
                      "blocked_share,p99_undisturbed_us,overlap_share");
        for (const rejection_row& row : rejections) {
            file.row(format("%s,%s,%d,%llu,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f", row.run.c_str(),
                            row.api_name.c_str(), row.threads_at_once, static_cast<unsigned long long>(row.count),
                            row.p50_us, row.p99_us, row.p999_us, row.max_us, row.preempted_share, row.blocked_share,
                            row.p99_unpreempted_us, row.overlap_share));
        }
    }

    // --- Tables -----------------------------------------------------------------
    const std::time_t started_at = std::chrono::system_clock::to_time_t(started);
    std::tm utc{};
    gmtime_r(&started_at, &utc);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", &utc);
    line(
        format("Machine: %u CPUs (%s), PostgreSQL %s on the same machine, libpqxx %s. Run %s, %.0f s%s. Load "
               "average (1, 5, 15 min) before: %s, after: %s.",
               std::thread::hardware_concurrency(), cpu_model().c_str(), server_version.c_str(), PQXX_VERSION, date,
               std::chrono::duration<double>(clock::now() - program_start).count(),
               config.scale < 1 ? " (--quick: shortened runs, not for figures)" : "", load_before.c_str(),
               load_average().c_str()));
    line();
    line(
        format("Settings: B = %d execution permits = pool size = raw connections, Q = %d, queue wait %lld ms, "
               "deadline %lld ms (goodput counts calls completed within it; the gate arm passes it as the call's "
               "deadline), %d open-loop callers for gate and pool-many (pool-many's connection_timeout %lld ms), "
               "closed loop with %d threads (pool-many: %d).",
               config.concurrent, config.extra_slots, static_cast<long long>(config.queue_wait.count()),
               static_cast<long long>(config.deadline.count()), config.many_workers,
               static_cast<long long>(config.many_connection_timeout.count()), threads, config.many_closed));
    line();
    line("### Round trips and server transactions per call");
    line();
    line(
        "One connection, calls one after another through the counting relay (the CPU times per call are in "
        "the CSV; on a shared machine they are noisy).");
    line();
    line("| workload | arm | round trips per call (wire) | server transactions per call (xact_commit) |");
    line("|---|---|---:|---:|");
    for (const round_trip_row& row : round_trips) {
        line(format("| %s | %s | %.2f | %.2f |", std::string(name(row.kind)).c_str(), row.arm.c_str(), row.round_trips,
                    row.server_transactions));
    }
    if (!statement_costs.empty()) {
        line();
        line(
            "What each arm's SELECT 1 call costs the server: the same statements sent on one plain connection, "
            "server backend CPU per call (median of " +
            std::to_string(statement_reps) + " interleaved runs of " +
            std::to_string(static_cast<int>(2000 * config.scale)) + " calls).");
        line();
        line("| sequence | statements (one round trip each) | server CPU µs per call | client CPU µs per call |");
        line("|---|---|---:|---:|");
        for (const statement_row& row : statement_costs) {
            line(format("| %s | %s | %.1f | %.1f |", row.sequence.c_str(), row.sent.c_str(), row.server_cpu_us,
                        row.client_cpu_us));
        }
    }
    line();
    line("### Closed loop (median of the repetitions)");
    line();
    line(
        "| workload | arm | threads | calls/s | vs raw | p50 ms | p99 ms | p99.9 ms | server xact/call | server tps | "
        "client CPU µs/call |");
    line("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    std::map<std::pair<workload, std::string>, std::vector<const closed_row*>> grouped;
    std::vector<std::pair<workload, std::string>> order;
    for (const closed_row& row : closed) {
        const auto key = std::make_pair(row.kind, row.arm);
        if (grouped[key].empty()) {
            order.push_back(key);
        }
        grouped[key].push_back(&row);
    }
    const auto median_of = [&](workload kind, const std::string& which, double closed_row::*field) {
        std::vector<double> values;
        for (const closed_row* row : grouped[{kind, which}]) {
            values.push_back(row->*field);
        }
        return median(values);
    };
    // Ratios per repetition (neighbouring runs), then the median.
    // The median of the throughput ratios of `which` to `baseline` in the
    // same repetitions (neighbouring runs).
    const auto ratio_between = [&](workload kind, const std::string& which, const std::string& baseline) {
        std::vector<double> ratios;
        const auto& mine = grouped[{kind, which}];
        const auto& raw = grouped[{kind, baseline}];
        for (const closed_row* row : mine) {
            for (const closed_row* base : raw) {
                if (base->rep == row->rep && base->threads == row->threads && base->throughput > 0) {
                    ratios.push_back(row->throughput / base->throughput);
                }
            }
        }
        return median(ratios);
    };
    const auto ratio_to_raw = [&](workload kind, const std::string& which) {
        return ratio_between(kind, which, "raw");
    };
    for (const auto& key : order) {
        const closed_row& first = *grouped[key].front();
        line(format("| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s |", std::string(name(key.first)).c_str(),
                    key.second.c_str(), first.threads, median_of(key.first, key.second, &closed_row::throughput),
                    number(ratio_to_raw(key.first, key.second), 3).c_str(),
                    number(median_of(key.first, key.second, &closed_row::p50_ms), 3).c_str(),
                    number(median_of(key.first, key.second, &closed_row::p99_ms), 3).c_str(),
                    number(median_of(key.first, key.second, &closed_row::p999_ms), 3).c_str(),
                    number(median_of(key.first, key.second, &closed_row::server_per_call), 2).c_str(),
                    number(median_of(key.first, key.second, &closed_row::server_tps), 0).c_str(),
                    number(median_of(key.first, key.second, &closed_row::client_cpu_us), 1).c_str()));
    }
    line();
    line(format("Capacity (gate, closed loop, %d threads): pg_sleep %.0f/s, SELECT 1 %.0f/s, read/write %.0f/s.",
                threads, capacity, capacities[workload::select1], capacities[workload::read_write]));
    line();
    line("### Open loop, pg_sleep(2 ms) (load in multiples of the capacity)");
    line();
    open_table(open, workload::sleep);
    line();
    line("### Open loop, SELECT 1 and read/write (load in multiples of their own capacity)");
    line();
    line("SELECT 1:");
    line();
    open_table(open, workload::select1);
    line();
    line("read/write:");
    line();
    open_table(open, workload::read_write);
    line();
    line("### Spike: 0.5x for 3 s, 4x for 10 s, 0.5x for 5 s (pg_sleep)");
    line();
    line("| arm | phase | offered/s | goodput/s | admitted p99 ms | rejected | timed out |");
    line("|---|---|---:|---:|---:|---:|---:|");
    for (const spike_series& series : spikes) {
        std::int64_t from = 0;
        const char* names[] = {"before (0.5x)", "spike (4x)", "after (0.5x)"};
        for (std::size_t i = 0; i < spike_phases.size(); ++i) {
            const std::int64_t to = from + spike_phases[i].length.count();
            const double seconds = static_cast<double>(spike_phases[i].length.count()) / 1e9;
            const run_summary s = summarize(series.calls, config.deadline, seconds, from, to);
            line(format("| %s | %s | %.0f | %.0f | %s | %.1f %% | %.1f %% |", series.arm.c_str(), names[i],
                        static_cast<double>(s.offered) / seconds, s.goodput, number(s.admitted_p99_ms, 2).c_str(),
                        100 * s.share(s.rejected_full + s.rejected_wait), 100 * s.share(s.late + s.cut + s.unserved)));
            from = to;
        }
    }
    line();
    line("### Rejection latency through the whole gate (admission_full, time to say no)");
    line();
    line(
        "| run | API | threads rejecting at once | rejections | p50 µs | p99 µs | p99.9 µs | max µs | preempted "
        "during the call | slept during the call | p99 µs of the others |");
    line("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (const rejection_row& row : rejections) {
        const std::string at_once =
            row.threads_at_once == 2
                ? format("2 (calls inside the other's burst; bursts overlapped in %s %% of rounds)",
                         number(100 * row.overlap_share, 0).c_str())
                : format("any of %d callers", row.threads_at_once > 2 ? row.threads_at_once : config.many_workers);
        line(format("| %s | %s | %s | %llu | %s | %s | %s | %s | %s %% | %s %% | %s |", row.run.c_str(),
                    row.api_name.c_str(), at_once.c_str(), static_cast<unsigned long long>(row.count),
                    number(row.p50_us, 2).c_str(), number(row.p99_us, 2).c_str(), number(row.p999_us, 2).c_str(),
                    number(row.max_us, 1).c_str(), number(100 * row.preempted_share, 2).c_str(),
                    number(100 * row.blocked_share, 2).c_str(), number(row.p99_unpreempted_us, 2).c_str()));
    }
    line();

    if (!storm.empty()) {
        line(
            format("### Retry storm: %d callers, closed loop, pg_sleep(2 ms), B = Q = %d, no pause after a "
                   "rejection",
                   storm_threads, storm_slots));
        line();
        line(
            "| API | rep | admitted/s | admitted p99 ms | rejected/s | rejection p50 µs | p99 µs | p99.9 µs | "
            "preempted during the call | p99 µs of the others |");
        line("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (const storm_row& row : storm) {
            line(format("| %s | %d | %.0f | %s | %.0f | %s | %s | %s | %s %% | %s |", row.api_name.c_str(), row.rep,
                        row.admitted_per_s, number(row.admitted_p99_ms, 2).c_str(), row.rejected_per_s,
                        number(row.rejections.p50_us, 2).c_str(), number(row.rejections.p99_us, 2).c_str(),
                        number(row.rejections.p999_us, 2).c_str(),
                        number(100 * row.rejections.preempted_share, 2).c_str(),
                        number(row.rejections.p99_unpreempted_us, 2).c_str()));
        }
        line();
    }

    // --- Targets ------------------------------------------------------------------
    line("### Targets");
    line();
    {
        double raw_trips = std::nan(""), gate_trips = std::nan(""), raw_xact = std::nan(""), gate_xact = std::nan("");
        for (const round_trip_row& row : round_trips) {
            if (row.kind == workload::select1 && row.arm == "raw") {
                raw_trips = row.round_trips;
                raw_xact = row.server_transactions;
            }
            if (row.kind == workload::select1 && row.arm == "gate") {
                gate_trips = row.round_trips;
                gate_xact = row.server_transactions;
            }
        }
        // Issue 13's goals: the pool's default options at least raw libpqxx's
        // throughput, with a deadline at least 0.98 of it.
        const std::vector<std::tuple<workload, std::string, double, std::string>> goals = {
            {workload::select1, "gate-rw-nodl", 1.0, "SELECT 1, default options (read-write)"},
            {workload::select1, "gate-nodl", 1.0, "SELECT 1, read-only"},
            {workload::select1, "gate-execute", 0.98, "SELECT 1, read-only, deadline, one round trip (execute)"},
            {workload::tpcb, "gate-rw-nodl", 1.0, "tpcb (3 UPDATEs, SELECT, INSERT), default options"},
            {workload::sleep, "gate-rw-nodl", 1.0, "pg_sleep(2 ms), default options"},
            {workload::select1, "gate-rw", 0.98, "SELECT 1, read-write, deadline"},
            {workload::select1, "gate", 0.98, "SELECT 1, read-only, deadline"},
            {workload::tpcb, "gate-rw", 0.98, "tpcb, deadline"},
            {workload::sleep, "gate", 0.98, "pg_sleep(2 ms), read-only, deadline"},
        };
        for (const auto& [kind, which, goal, what] : goals) {
            if (grouped[{kind, which}].empty()) {
                continue;
            }
            const double ratio = ratio_to_raw(kind, which);
            line(
                format("- Gate + pool (%s) vs raw libpqxx, closed loop, %d threads each, client and server sharing "
                       "2 cores: throughput ratio %s against >= %.2f: %s.",
                       what.c_str(), threads, number(ratio, 3).c_str(), goal, verdict(ratio >= goal).c_str()));
        }
        const double tracking = ratio_between(workload::select1, "gate-rw", "gate-rw-untracked");
        line(
            format("- Commit-outcome tracking on a read-write SELECT 1 (no id assigned): gate-rw / gate-rw-untracked "
                   "throughput %s against >= 0.95: %s.",
                   number(tracking, 3).c_str(), verdict(tracking >= 0.95).c_str()));
        line(
            format("- Commit-outcome tracking on tpcb (writes: the pipelined COMMIT): gate-rw / gate-rw-untracked "
                   "throughput %s (the cost of resolving a lost COMMIT; no goal).",
                   number(ratio_between(workload::tpcb, "gate-rw", "gate-rw-untracked"), 3).c_str()));
        line(
            format("- Connection affinity (connection_affinity): gate-rw-nodl / gate-rw-nodl-noaffinity throughput "
                   "%s on SELECT 1, %s on tpcb (no goal).",
                   number(ratio_between(workload::select1, "gate-rw-nodl", "gate-rw-nodl-noaffinity"), 3).c_str(),
                   number(ratio_between(workload::tpcb, "gate-rw-nodl", "gate-rw-nodl-noaffinity"), 3).c_str()));
        line(
            format("- The session reset (reset_session): gate-rw-nodl / gate-rw-nodl-noreset throughput %s on "
                   "SELECT 1, %s on tpcb (what the reset's six statements cost; no goal).",
                   number(ratio_between(workload::select1, "gate-rw-nodl", "gate-rw-nodl-noreset"), 3).c_str(),
                   number(ratio_between(workload::tpcb, "gate-rw-nodl", "gate-rw-nodl-noreset"), 3).c_str()));
        line(format("- Round trips per call: gate %s, raw %s; server transactions per call: gate %s, raw %s: %s.",
                    number(gate_trips, 2).c_str(), number(raw_trips, 2).c_str(), number(gate_xact, 2).c_str(),
                    number(raw_xact, 2).c_str(),
                    verdict(!std::isnan(gate_trips) && gate_trips <= raw_trips + 0.01 && gate_xact <= raw_xact + 0.01)
                        .c_str()));
    }
    if (!storm.empty()) {
        std::vector<double> thrown_p99, try_p99, admitted, baseline;
        for (const storm_row& row : storm) {
            if (row.rep == 0) {
                baseline.push_back(row.admitted_per_s);
            } else {
                (row.api_name == "try_transaction" ? try_p99 : thrown_p99).push_back(row.rejections.p99_us);
                admitted.push_back(row.admitted_per_s);
            }
        }
        const double worst_thrown = *std::max_element(thrown_p99.begin(), thrown_p99.end());
        line(format(
            "- Retry storm (%d callers, B = Q = %d, pg_sleep): throwing transaction() rejection p99 %s µs "
            "(worst repetition; try_transaction %s µs) against <= 2 µs: %s. Admitted %s/s during the storm "
            "against %s/s with %d callers.",
            storm_threads, storm_slots, number(worst_thrown, 2).c_str(),
            number(*std::max_element(try_p99.begin(), try_p99.end()), 2).c_str(), verdict(worst_thrown <= 2.0).c_str(),
            number(median(admitted), 0).c_str(), number(median(baseline), 0).c_str(), 2 * storm_slots));
    }
    {
        double peak = 0;
        double peak_load = 0;
        for (const open_row& row : open) {
            if (row.kind == workload::sleep && row.arm == "gate" && !row.probe && row.summary.goodput > peak) {
                peak = row.summary.goodput;
                peak_load = row.load;
            }
        }
        const open_row* at4 = find_open(open, workload::sleep, "gate", 4.0);
        const open_row* at08 = find_open(open, workload::sleep, "gate", 0.8);
        const open_row* many4 = find_open(open, workload::sleep, "pool-many", 4.0);
        double many_peak = 0;
        for (const open_row& row : open) {
            if (row.kind == workload::sleep && row.arm == "pool-many") {
                many_peak = std::max(many_peak, row.summary.goodput);
            }
        }
        if (at4 != nullptr && at08 != nullptr && many4 != nullptr) {
            const double goodput_ratio = at4->summary.goodput / peak;
            const double p99_ratio = at4->summary.admitted_p99_ms / at08->summary.admitted_p99_ms;
            line(
                format("- Overload at 4x capacity (pg_sleep): gate goodput %.0f/s = %.3f of its peak %.0f/s (at "
                       "%.1fx) against >= 0.9: %s.",
                       at4->summary.goodput, goodput_ratio, peak, peak_load, verdict(goodput_ratio >= 0.9).c_str()));
            line(format("- Admitted p99 at 4x %.2f ms = %.2f times the p99 at 0.8x (%.2f ms) against <= 2: %s.",
                        at4->summary.admitted_p99_ms, p99_ratio, at08->summary.admitted_p99_ms,
                        verdict(p99_ratio <= 2.0).c_str()));
            line(format(
                "- Contrast, pool-many at 4x: goodput %.0f/s = %.3f of its peak %.0f/s, admitted p99 %.1f ms, "
                "%.1f %% timed out.",
                many4->summary.goodput, many4->summary.goodput / many_peak, many_peak, many4->summary.admitted_p99_ms,
                100 * many4->summary.share(many4->summary.late + many4->summary.cut + many4->summary.unserved)));
        }
        for (const rejection_row& row : rejections) {
            if (row.run.rfind("pg_sleep", 0) != 0) {
                continue;  // the idle-caller rows explain, they are not the overload run
            }
            line(format("- p99 rejection latency through the whole gate < 10 µs, %s, %s: %s µs: %s.", row.run.c_str(),
                        row.api_name.c_str(), number(row.p99_us, 2).c_str(), verdict(row.p99_us < 10.0).c_str()));
        }
    }

    const std::string markdown_path = config.prefix + ".md";
    std::ofstream(markdown_path) << report;
    std::fputs(report.c_str(), stdout);
    progress("done; results in %s-*.csv and %s", config.prefix.c_str(), markdown_path.c_str());
    return 0;
}

std::string utc_stamp() {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char text[32];
    std::strftime(text, sizeof(text), "%Y-%m-%dT%H%M%SZ", &utc);
    return text;
}

/// --profile: `calls` calls of `kind` by one arm on one connection, one after
/// another, for a profiler (valgrind --tool=callgrind, perf record): run it
/// with two call counts and subtract to get the cost of one call.
int profile(const settings& config, const std::string& which, int calls, workload kind) {
    if (!is_read_only(kind)) {
        prepare_database(config.conninfo);
    }
    const std::unique_ptr<arm> target = make_arm(config, config.conninfo, which, kind, 1);
    std::mt19937_64 random(42);
    for (int i = 0; i < 200; ++i) {
        (void)target->call(0, clock::now(), api::try_api, random);
    }
    const std::int64_t cpu_before = thread_cpu_ns();
    const clock::time_point began = clock::now();
    for (int i = 0; i < calls; ++i) {
        (void)target->call(0, clock::now(), api::try_api, random);
    }
    std::printf("%s, %s: %d calls, %.1f us per call, client CPU %.2f us per call\n", which.c_str(),
                std::string(name(kind)).c_str(), calls,
                static_cast<double>(nanoseconds_between(began, clock::now())) / calls / 1e3,
                static_cast<double>(thread_cpu_ns() - cpu_before) / calls / 1e3);
    return 0;
}

int usage() {
    std::fputs(
        "usage: bulkhead_pg_bench [--conninfo CONNINFO] [--prefix PATH] [--quick] [--only PARTS]\n"
        "       bulkhead_pg_bench [--conninfo CONNINFO] --profile ARM CALLS [WORKLOAD]\n"
        "  CONNINFO defaults to $BULKHEAD_TEST_DATABASE; PATH to bench/results/pg-<UTC time>;\n"
        "  PARTS: comma-separated, of roundtrips,closed,open,probe,storm,spike,cpu (default: all)\n"
        "  WORKLOAD: select1 (default), read_write, sleep, tpcb\n",
        stderr);
    return 2;
}

}  // namespace
}  // namespace bulkhead_bench

int main(int argc, char** argv) {
    using namespace bulkhead_bench;
    settings config;
    std::string profile_arm;
    int profile_calls = 0;
    workload profile_kind = workload::select1;
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        if (argument == "--conninfo" && i + 1 < argc) {
            config.conninfo = argv[++i];
        } else if (argument == "--prefix" && i + 1 < argc) {
            config.prefix = argv[++i];
        } else if (argument == "--quick") {
            config.scale = 0.25;
        } else if (argument == "--profile" && i + 2 < argc) {
            profile_arm = argv[++i];
            profile_calls = std::atoi(argv[++i]);
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                const std::string_view wanted = argv[++i];
                const auto named = std::find_if(std::begin(all_workloads), std::end(all_workloads),
                                                [&](workload kind) { return name(kind) == wanted; });
                if (named == std::end(all_workloads)) {
                    std::fprintf(stderr, "bulkhead_pg_bench: --profile: no workload named '%s'\n", argv[i]);
                    return usage();
                }
                profile_kind = *named;
            }
        } else if (argument == "--only" && i + 1 < argc) {
            std::string parts = argv[++i];
            for (std::size_t from = 0; from <= parts.size();) {
                const std::size_t comma = std::min(parts.find(',', from), parts.size());
                config.only.push_back(parts.substr(from, comma - from));
                from = comma + 1;
            }
        } else {
            return usage();
        }
    }
    if (config.conninfo.empty()) {
        if (const char* from_environment = std::getenv("BULKHEAD_TEST_DATABASE")) {
            config.conninfo = from_environment;
        }
    }
    if (config.conninfo.empty()) {
        std::fputs("bulkhead_pg_bench: no database: pass --conninfo or set BULKHEAD_TEST_DATABASE\n", stderr);
        return usage();
    }
    if (config.prefix.empty()) {
        config.prefix = "bench/results/pg-" + utc_stamp();
    }
    try {
        if (!profile_arm.empty()) {
            return profile(config, profile_arm, profile_calls, profile_kind);
        }
        return run(config);
    } catch (const std::exception& failure) {
        std::fprintf(stderr, "bulkhead_pg_bench: %s\n", bulkhead::redact_conninfo(failure.what()).c_str());
        return 1;
    }
}
