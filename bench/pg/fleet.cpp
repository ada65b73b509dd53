// bulkhead_fleet_bench: a fleet of application instances against one
// PostgreSQL, straight and through PgBouncer in transaction pooling mode
// (issue 16 item 4; docs/performance.md "A fleet through PgBouncer",
// docs/pgbouncer.md; scripts/bench-fleet runs it).
//
// Every instance is a process of its own (this program, started again with
// --instance), with its own pqxx_pool and gate (B = its pool size, Q = its
// callers), and --threads closed-loop callers that run the chosen workload
// (arms.hpp) through the gate back to back. Three arms:
//   direct         each pool holds --pool connections straight to the server:
//                  instances x pool server connections (each instance's
//                  start-up budget check refuses a fleet that does not fit);
//   direct-fitted  the same fleet squeezed into --server-connections straight
//                  to the server: pool = server connections / instances;
//   pgbouncer      each pool holds --pool connections to PgBouncer, whose own
//                  pool holds --server-connections server connections.
// Each reports committed calls per second, p50/p99 of a committed call (its
// start to its end: the gate's queue, the pool, the work), failures, and the
// most server connections seen (pg_stat_activity, sampled every 50 ms).
//
// Then the restart: the pgbouncer fleet runs; after --restart-after seconds
// PgBouncer is stopped (SIGTERM, its immediate shutdown: every client and
// server connection closed) and started again on its port --down-ms after
// the stop (1000 by default: a service manager's restart). For each
// instance, the time from the stop until the end of its first committed call
// that began after PgBouncer was gone. A caller whose call failed pauses 2 ms
// before the next (no busy loop against a closed port); that pause is inside
// the figure.
//
//   BULKHEAD_TEST_DATABASE=... BULKHEAD_BENCH_BOUNCER=...
//   BULKHEAD_BENCH_BOUNCER_SCRIPT=... BULKHEAD_BENCH_BOUNCER_STATE=...
//   bulkhead_fleet_bench --prefix PATH [--instances 8] [--pool 10]
//       [--threads 20] [--server-connections 10] [--seconds 10]
//       [--workload read_write] [--restart-after 3] [--down-ms 1000]
//       [--restart-window 12]
//
// BULKHEAD_BENCH_BOUNCER is the conninfo through PgBouncer; the SCRIPT and
// STATE name tests/support/pgbouncer_throwaway.sh and its state directory
// (stop-bouncer, start-bouncer). scripts/bench-on-throwaway sets all four.
// Writes PATH.md (the tables) and PATH-restart.csv (committed calls per
// 100 ms and instances served, around the restart).
#include "load.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <pqxx/pqxx>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux: one clock for every process
using bulkhead_bench::workload;

constexpr const char* program = "bulkhead_fleet_bench";

/// One call of an instance, as written to its records file.
struct call_record {
    std::int64_t began_ns = 0;  ///< steady_clock, since its epoch (the same in every process)
    std::int64_t ended_ns = 0;
    std::int32_t what = 0;  ///< 0 committed, 1 refused by the gate, 2 failed
    std::int32_t unused = 0;
};
constexpr std::int32_t committed = 0;
constexpr std::int32_t refused = 1;
constexpr std::int32_t failed = 2;

std::int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count(); }

int positive(const std::string& option, const std::string& text) {
    return bulkhead_bench::positive_argument(option, text);
}

workload parse_workload(const std::string& text) {
    for (const workload kind : bulkhead_bench::all_workloads) {
        if (bulkhead_bench::name(kind) == text) {
            return kind;
        }
    }
    throw std::invalid_argument(std::string(program) + ": --workload wants select1, read_write, sleep or tpcb, not '" +
                                text.substr(0, 20) + "'");
}

std::string required_env(const char* variable) {
    const char* value = std::getenv(variable);  // NOLINT(concurrency-mt-unsafe): read before any thread starts
    if (value == nullptr || *value == '\0') {
        throw std::runtime_error(std::string(program) + ": set " + variable + " (scripts/bench-fleet does)");
    }
    return value;
}

// ---------------------------------------------------------------------------
// One instance (--instance)
// ---------------------------------------------------------------------------

struct instance_settings {
    std::string name;
    int pool = 10;
    int threads = 20;
    int instances = 8;
    int seconds = 10;
    bool check_budget = false;
    workload kind = workload::read_write;
    std::string records;
    std::string go;
};

void say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    (void)std::fflush(stdout);
}

/// Runs one instance: pool, budget check, "ready", waits for the go file,
/// the load, the records file, "done ...". The conninfo comes from
/// BULKHEAD_FLEET_CONNINFO (never the command line: it holds a password).
int run_instance(const instance_settings& s) {
    const std::string conninfo = required_env("BULKHEAD_FLEET_CONNINFO");
    bulkhead::pqxx_pool_options options =
        bulkhead_bench::pool_settings(conninfo, s.pool, std::chrono::milliseconds(2000));
    options.application_name = s.name;
    if (s.check_budget) {
        options.budget_check = bulkhead::budget_check_mode::refuse;
        options.fleet = {.instances = static_cast<std::size_t>(s.instances), .application_prefix = "bulkhead_fleet_"};
    }
    try {
        bulkhead::pqxx_pool pool(options);
        bulkhead::db_bulkhead gate(pool, s.pool, s.threads);
        say("ready");
        while (!std::filesystem::exists(s.go)) {
            std::this_thread::sleep_for(1ms);
        }
        const std::int64_t until = now_ns() + std::chrono::nanoseconds(std::chrono::seconds(s.seconds)).count();
        std::vector<std::vector<call_record>> per_thread(static_cast<std::size_t>(s.threads));
        std::vector<std::thread> callers;
        for (int t = 0; t < s.threads; ++t) {
            callers.emplace_back([&, t] {
                std::mt19937_64 random(static_cast<std::uint64_t>(t) * 7919U + std::hash<std::string>{}(s.name));
                std::vector<call_record>& out = per_thread[static_cast<std::size_t>(t)];
                out.reserve(1U << 14U);
                while (now_ns() < until) {
                    call_record call{.began_ns = now_ns()};
                    try {
                        const bulkhead::result<void> done = gate.try_transaction(
                            {.queue_wait = 5s,
                             .deadline = steady::now() + 5s,
                             .transaction = {.read_only = bulkhead_bench::is_read_only(s.kind)}},
                            [&](pqxx::dbtransaction& tx) { (void)bulkhead_bench::run_statements(tx, s.kind, random); });
                        call.what = done ? committed : refused;
                    } catch (const std::exception&) {
                        call.what = failed;
                    }
                    call.ended_ns = now_ns();
                    out.push_back(call);
                    if (call.what != committed) {
                        std::this_thread::sleep_for(2ms);
                    }
                }
            });
        }
        for (std::thread& caller : callers) {
            caller.join();
        }
        std::ofstream file(s.records, std::ios::binary | std::ios::trunc);
        long counts[3] = {0, 0, 0};
        for (const std::vector<call_record>& part : per_thread) {
            for (const call_record& call : part) {
                ++counts[call.what];  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
            }
            file.write(reinterpret_cast<const char*>(part.data()),  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
                       static_cast<std::streamsize>(part.size() * sizeof(call_record)));
        }
        file.close();
        const bool permits_back = gate.available() == s.pool && gate.running() == 0 && pool.in_use() == 0;
        say("done committed=" + std::to_string(counts[0]) + " refused=" + std::to_string(counts[1]) +
            " failed=" + std::to_string(counts[2]) + " permits_back=" + std::to_string(static_cast<int>(permits_back)) +
            " connect_failures=" + std::to_string(pool.stats().connect_failures));
        return file ? 0 : 1;
    } catch (const std::exception& failure) {
        say(std::string("failed: ") + bulkhead::detail::one_line(failure.what()));
        return 1;
    }
}

// ---------------------------------------------------------------------------
// The orchestrator
// ---------------------------------------------------------------------------

struct settings {
    std::string prefix;
    int instances = 8;
    int pool = 10;
    int threads = 20;
    int server_connections = 10;
    int seconds = 10;
    int restart_after = 3;
    int restart_window = 12;
    int down_ms = 1000;
    workload kind = workload::read_write;
};

/// Most client backends seen on the server, sampled every 50 ms on a
/// connection of its own (not counted): only the fleet's own sessions
/// (application_name bulkhead_fleet_N) when `fleet_only`, else every one
/// (through PgBouncer, its server connections carry whichever client's name
/// was set last).
class connection_monitor {
public:
    connection_monitor(const std::string& conninfo, bool fleet_only)
        : m_connection(bulkhead_bench::with_field(conninfo, "application_name", "bulkhead_monitor")),
          m_query(std::string("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> "
                              "pg_backend_pid()") +
                  (fleet_only ? " AND application_name LIKE 'bulkhead\\_fleet\\_%'" : "")),
          m_thread([this] { sample(); }) {}
    connection_monitor(const connection_monitor&) = delete;
    connection_monitor& operator=(const connection_monitor&) = delete;
    ~connection_monitor() {
        m_stop = true;
        m_thread.join();
    }
    [[nodiscard]] long peak() const { return m_peak.load(); }
    void reset() { m_peak = 0; }

private:
    void sample() {
        while (!m_stop) {
            try {
                pqxx::nontransaction tx(m_connection);
                const long count = tx.exec(m_query)[0][0].as<long>();
                long seen = m_peak.load();
                while (count > seen && !m_peak.compare_exchange_weak(seen, count)) {
                }
            } catch (const std::exception& failure) {
                std::fprintf(stderr, "%s: the connection monitor failed: %s\n", program, failure.what());
                return;
            }
            std::this_thread::sleep_for(50ms);
        }
    }

    pqxx::connection m_connection;
    std::string m_query;
    std::atomic<bool> m_stop{false};
    std::atomic<long> m_peak{0};
    std::thread m_thread;  // last: starts once the rest is built
};

/// A started fleet: one child process per instance, reading their lines.
struct fleet_run {
    std::vector<std::vector<call_record>> records;  ///< per instance
    std::vector<std::string> done_lines;
    std::int64_t go_ns = 0;
    long peak_connections = 0;
};

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string read_line(FILE* pipe) {
    std::array<char, 4096> buffer{};
    if (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) == nullptr) {
        return {};
    }
    std::string line(buffer.data());
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
        line.pop_back();
    }
    return line;
}

std::vector<call_record> read_records(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    std::vector<call_record> records;
    call_record call;
    while (file.read(reinterpret_cast<char*>(&call), sizeof call)) {  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
        records.push_back(call);
    }
    return records;
}

/// Starts `s.instances` instances of `pool` connections each on `conninfo`,
/// lets them run `seconds`, and while they run calls `during` (given the go
/// time). Throws when an instance does not get ready or fails.
template <class During>
fleet_run run_fleet(const settings& s, const std::string& conninfo, const std::string& server_conninfo, int pool,
                    bool check_budget, int seconds, During during) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("bulkhead-fleet-" + std::to_string(::getpid()) + "-" + std::to_string(now_ns()));
    std::filesystem::create_directories(dir);
    const std::filesystem::path go = dir / "go";
    // Set before any child starts and before the monitor's thread: the
    // children inherit it; nothing else reads the environment meanwhile.
    if (::setenv("BULKHEAD_FLEET_CONNINFO", conninfo.c_str(), 1) != 0) {  // NOLINT(concurrency-mt-unsafe)
        throw std::runtime_error(std::string(program) + ": setenv failed");
    }
    std::vector<FILE*> children;
    for (int i = 0; i < s.instances; ++i) {
        const std::string command =
            "'" + self_path() + "' --instance bulkhead_fleet_" + std::to_string(i) + " --pool " + std::to_string(pool) +
            " --threads " + std::to_string(s.threads) + " --instances " + std::to_string(s.instances) + " --seconds " +
            std::to_string(seconds) + " --workload " + std::string(bulkhead_bench::name(s.kind)) + " --check " +
            (check_budget ? "refuse" : "off") + " --records '" + (dir / ("records-" + std::to_string(i))).string() +
            "' --go '" + go.string() + "'";
        FILE* child = ::popen(command.c_str(), "r");
        if (child == nullptr) {
            throw std::runtime_error(std::string(program) + ": cannot start an instance");
        }
        children.push_back(child);
    }
    ::unsetenv("BULKHEAD_FLEET_CONNINFO");  // NOLINT(concurrency-mt-unsafe): still one thread
    std::string trouble;
    for (std::size_t i = 0; i < children.size(); ++i) {
        const std::string line = read_line(children[i]);
        if (line != "ready" && trouble.empty()) {
            trouble = "instance " + std::to_string(i) + " did not get ready: " + line;
        }
    }
    fleet_run run;
    {
        connection_monitor monitor(server_conninfo, /*fleet_only=*/conninfo == server_conninfo);
        std::this_thread::sleep_for(200ms);  // one sample of the idle fleet
        run.go_ns = now_ns();
        std::ofstream(go.string()) << "go\n";
        if (trouble.empty()) {
            during(run.go_ns);
        }
        for (FILE* child : children) {
            run.done_lines.push_back(read_line(child));
        }
        run.peak_connections = monitor.peak();
    }
    for (std::size_t i = 0; i < children.size(); ++i) {
        const int status = ::pclose(children[i]);
        if (status != 0 && trouble.empty()) {
            trouble = "instance " + std::to_string(i) + " ended with status " + std::to_string(status) + ": " +
                      run.done_lines[i];
        }
        run.records.push_back(read_records((dir / ("records-" + std::to_string(i))).string()));
    }
    std::filesystem::remove_all(dir);
    if (!trouble.empty()) {
        throw std::runtime_error(std::string(program) + ": " + trouble);
    }
    return run;
}

struct arm_figures {
    std::string arm;
    int pool = 0;
    std::string path;
    long server_connections = 0;
    double committed_per_s = 0;
    double p50_ms = 0;
    double p99_ms = 0;
    long refused_calls = 0;
    long failed_calls = 0;
    bool permits_back = true;
};

arm_figures summarize_arm(const std::string& arm, int pool, const std::string& path, const fleet_run& run,
                          int seconds) {
    arm_figures figures{.arm = arm, .pool = pool, .path = path, .server_connections = run.peak_connections};
    std::vector<std::int64_t> latencies;
    const std::int64_t end = run.go_ns + std::chrono::nanoseconds(std::chrono::seconds(seconds)).count();
    long in_window = 0;
    for (const std::vector<call_record>& instance : run.records) {
        for (const call_record& call : instance) {
            if (call.what == committed) {
                latencies.push_back(call.ended_ns - call.began_ns);
                in_window += call.ended_ns <= end ? 1 : 0;
            } else {
                ++(call.what == refused ? figures.refused_calls : figures.failed_calls);
            }
        }
    }
    figures.committed_per_s = static_cast<double>(in_window) / seconds;
    figures.p50_ms = bulkhead_bench::quantile(latencies, 0.50) / 1e6;
    figures.p99_ms = bulkhead_bench::quantile(latencies, 0.99) / 1e6;
    for (const std::string& line : run.done_lines) {
        figures.permits_back = figures.permits_back && line.find("permits_back=1") != std::string::npos;
    }
    return figures;
}

void run_command(const std::string& command) {
    const int status = std::system(command.c_str());  // NOLINT(concurrency-mt-unsafe,cert-env33-c): our own script
    if (status != 0) {
        throw std::runtime_error(std::string(program) + ": '" + command.substr(0, 120) + "' failed");
    }
}

std::string fixed(double value, int digits) {
    std::ostringstream out;
    out.setf(std::ios::fixed);
    out.precision(digits);
    out << value;
    return out.str();
}

int run_orchestrator(const settings& s) {
    const std::string database = bulkhead_bench::database_from_env(program);
    const std::string bouncer = required_env("BULKHEAD_BENCH_BOUNCER");
    const std::string script = required_env("BULKHEAD_BENCH_BOUNCER_SCRIPT");
    const std::string state = required_env("BULKHEAD_BENCH_BOUNCER_STATE");
    bulkhead_bench::prepare_database(database);
    const int fitted_pool = std::max(1, s.server_connections / s.instances);
    const auto nothing = [](std::int64_t /*go*/) {};

    std::vector<arm_figures> arms;
    std::fprintf(stderr, "%s: direct: %d instances x pool %d\n", program, s.instances, s.pool);
    arms.push_back(summarize_arm("direct", s.pool, "server",
                                 run_fleet(s, database, database, s.pool, true, s.seconds, nothing), s.seconds));
    std::fprintf(stderr, "%s: direct-fitted: %d instances x pool %d\n", program, s.instances, fitted_pool);
    arms.push_back(summarize_arm("direct-fitted", fitted_pool, "server",
                                 run_fleet(s, database, database, fitted_pool, true, s.seconds, nothing), s.seconds));
    std::fprintf(stderr, "%s: pgbouncer: %d instances x pool %d\n", program, s.instances, s.pool);
    arms.push_back(summarize_arm("pgbouncer", s.pool, "PgBouncer, " + std::to_string(s.server_connections) + " server",
                                 run_fleet(s, bouncer, database, s.pool, false, s.seconds, nothing), s.seconds));

    // The restart.
    std::int64_t stop_ns = 0;
    std::int64_t down_ns = 0;
    std::int64_t up_ns = 0;
    const int restart_seconds = s.restart_after + s.restart_window;
    std::fprintf(stderr, "%s: PgBouncer restart after %d s\n", program, s.restart_after);
    const fleet_run restart = run_fleet(s, bouncer, database, s.pool, false, restart_seconds, [&](std::int64_t go) {
        std::this_thread::sleep_until(steady::time_point(std::chrono::nanoseconds(go)) + std::chrono::seconds(s.restart_after));
        stop_ns = now_ns();
        run_command("bash '" + script + "' stop-bouncer '" + state + "'");
        down_ns = now_ns();
        std::this_thread::sleep_until(steady::time_point(std::chrono::nanoseconds(stop_ns)) +
                                      std::chrono::milliseconds(s.down_ms));
        run_command("bash '" + script + "' start-bouncer '" + state + "'");
        up_ns = now_ns();
    });
    std::vector<double> recovery_ms;  // per instance; negative: never served again
    long failures_in_outage = 0;
    for (const std::vector<call_record>& instance : restart.records) {
        std::int64_t served_ns = -1;
        for (const call_record& call : instance) {
            if (call.what == committed && call.began_ns >= down_ns && (served_ns < 0 || call.ended_ns < served_ns)) {
                served_ns = call.ended_ns;
            }
        }
        for (const call_record& call : instance) {
            if (call.what != committed && call.ended_ns >= stop_ns && (served_ns < 0 || call.ended_ns <= served_ns)) {
                ++failures_in_outage;
            }
        }
        recovery_ms.push_back(served_ns < 0 ? -1.0 : static_cast<double>(served_ns - stop_ns) / 1e6);
    }
    const bool all_served = std::none_of(recovery_ms.begin(), recovery_ms.end(), [](double v) { return v < 0; });
    std::vector<double> sorted = recovery_ms;
    std::sort(sorted.begin(), sorted.end());

    // The timeline around the restart: committed calls per 100 ms, and how
    // many instances committed at least one call in it.
    {
        constexpr std::int64_t bucket_ns = 100'000'000;
        const auto buckets = static_cast<std::size_t>(restart_seconds * 10);
        std::vector<long> commits(buckets, 0);
        std::vector<std::vector<bool>> served(buckets, std::vector<bool>(restart.records.size(), false));
        for (std::size_t i = 0; i < restart.records.size(); ++i) {
            for (const call_record& call : restart.records[i]) {
                const std::int64_t offset = call.ended_ns - restart.go_ns;
                if (call.what == committed && offset >= 0 && static_cast<std::size_t>(offset / bucket_ns) < buckets) {
                    const auto b = static_cast<std::size_t>(offset / bucket_ns);
                    ++commits[b];
                    served[b][i] = true;
                }
            }
        }
        std::ofstream csv(s.prefix + "-restart.csv");
        csv << "# PgBouncer stopped at " << fixed(static_cast<double>(stop_ns - restart.go_ns) / 1e9, 3)
            << " s, gone at " << fixed(static_cast<double>(down_ns - restart.go_ns) / 1e9, 3) << " s, answering at "
            << fixed(static_cast<double>(up_ns - restart.go_ns) / 1e9, 3) << " s\n";
        csv << "t_s,committed_per_s,instances_served\n";
        for (std::size_t b = 0; b < buckets; ++b) {
            csv << fixed(static_cast<double>(b) / 10.0, 1) << ',' << commits[b] * 10 << ','
                << std::count(served[b].begin(), served[b].end(), true) << '\n';
        }
    }

    std::ostringstream md;
    md << "# Fleet: " << s.instances << " instances, PostgreSQL straight and through PgBouncer\n\n"
       << "Workload " << bulkhead_bench::name(s.kind) << ", " << s.threads << " closed-loop callers per instance, "
       << s.seconds << " s per arm; gate B = pool, Q = callers. Server connections: the most client backends seen "
       << "(sampled every 50 ms; straight to the server the fleet's own sessions, through PgBouncer every one but the "
          "sampler's).\n\n"
       << "| arm | pool per instance | to | server connections (peak) | committed/s | p50 ms | p99 ms | refused | "
          "failed | permits back |\n"
       << "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const arm_figures& arm : arms) {
        md << "| " << arm.arm << " | " << arm.pool << " | " << arm.path << " | " << arm.server_connections << " | "
           << fixed(arm.committed_per_s, 0) << " | " << fixed(arm.p50_ms, 2) << " | " << fixed(arm.p99_ms, 2) << " | "
           << arm.refused_calls << " | " << arm.failed_calls << " | " << (arm.permits_back ? "yes" : "NO") << " |\n";
    }
    md << "\n## PgBouncer restart\n\n"
       << "Stopped (SIGTERM) " << s.restart_after << " s into the run, started again " << s.down_ms
       << " ms after the stop: gone after "
       << fixed(static_cast<double>(down_ns - stop_ns) / 1e6, 0) << " ms, answering again after "
       << fixed(static_cast<double>(up_ns - stop_ns) / 1e6, 0) << " ms (from the stop). Failed calls meanwhile: "
       << failures_in_outage << ".\n\n";
    if (all_served) {
        md << "Every instance served again (first committed call that began after PgBouncer was gone, from the stop): "
           << "first " << fixed(sorted.front(), 0) << " ms, median " << fixed(sorted[sorted.size() / 2], 0)
           << " ms, last " << fixed(sorted.back(), 0) << " ms; the last " << fixed(sorted.back() - static_cast<double>(up_ns - stop_ns) / 1e6, 0)
           << " ms after PgBouncer answered.\n";
    } else {
        md << "NOT every instance was served again within " << s.restart_window << " s: "
           << std::count_if(recovery_ms.begin(), recovery_ms.end(), [](double v) { return v < 0; }) << " of "
           << recovery_ms.size() << " were not.\n";
    }
    md << "\nPer instance (ms): ";
    for (std::size_t i = 0; i < recovery_ms.size(); ++i) {
        md << (i == 0 ? "" : ", ") << fixed(recovery_ms[i], 0);
    }
    md << "\n";
    std::ofstream(s.prefix + ".md") << md.str();
    std::cout << md.str();
    const bool permits_back = std::all_of(arms.begin(), arms.end(), [](const arm_figures& a) { return a.permits_back; });
    return all_served && permits_back ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const std::vector<std::string> arguments(argv + 1, argv + argc);  // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
        const bool instance = !arguments.empty() && arguments.front() == "--instance";
        settings s;
        instance_settings one;
        for (std::size_t i = 0; i < arguments.size(); i += 2) {
            const std::string& flag = arguments[i];
            if (i + 1 >= arguments.size()) {
                throw std::invalid_argument(std::string(program) + ": " + flag.substr(0, 30) + " needs a value");
            }
            const std::string& value = arguments[i + 1];
            if (flag == "--instance") {
                one.name = value;
            } else if (flag == "--prefix") {
                s.prefix = value;
            } else if (flag == "--instances") {
                s.instances = one.instances = positive(flag, value);
            } else if (flag == "--pool") {
                s.pool = one.pool = positive(flag, value);
            } else if (flag == "--threads") {
                s.threads = one.threads = positive(flag, value);
            } else if (flag == "--seconds") {
                s.seconds = one.seconds = positive(flag, value);
            } else if (flag == "--workload") {
                s.kind = one.kind = parse_workload(value);
            } else if (flag == "--server-connections") {
                s.server_connections = positive(flag, value);
            } else if (flag == "--restart-after") {
                s.restart_after = positive(flag, value);
            } else if (flag == "--down-ms") {
                s.down_ms = positive(flag, value);
            } else if (flag == "--restart-window") {
                s.restart_window = positive(flag, value);
            } else if (instance && flag == "--check") {
                one.check_budget = value == "refuse";
            } else if (instance && flag == "--records") {
                one.records = value;
            } else if (instance && flag == "--go") {
                one.go = value;
            } else {
                throw std::invalid_argument(std::string(program) + ": unknown option " + flag.substr(0, 30));
            }
        }
        if (instance) {
            return run_instance(one);
        }
        if (s.prefix.empty()) {
            throw std::invalid_argument(std::string(program) + ": --prefix PATH is required");
        }
        return run_orchestrator(s);
    } catch (const std::exception& failure) {
        std::fprintf(stderr, "%s\n", failure.what());
        return 2;
    }
}
