// bulkhead_rtt_bench: one-statement transactions across a network
// (docs/performance.md, "Round trips across a network"; scripts/bench-rtt).
//
//   bulkhead_rtt_bench [--conninfo CONNINFO] [--delays D:P,...] [--rounds N] [--seconds S]
//                      [--pgbench PATH] [--prefix PATH]
//
// Every client reaches the server through a relay (wire_counter.hpp) that
// delivers each chunk D microseconds late in each direction, so a round trip
// costs 2D more, and counts the round trips on the wire. For each D (with P
// caller threads, P connections and B = P), in N interleaved rounds (the
// arms' order rotated each round), S seconds each after a warm-up, closed
// loop, `SELECT 1` in a transaction:
//   raw         libpqxx alone: pqxx::work on a connection per thread (BEGIN,
//               the statement, COMMIT: three round trips)
//   gate        db_bulkhead over pqxx_pool, the callback taking
//               pqxx::dbtransaction& (BEGIN sent before the callback runs)
//   gate-deferred  the callback taking bulkhead::pqxx_transaction& (BEGIN
//               sent with the first statement)
//   gate-execute  db_bulkhead::execute(): BEGIN, the statement and COMMIT in
//               one write
//   pgbench     pgbench -n -c P -j P with the script BEGIN; SELECT 1; COMMIT
//               (the simple protocol: three round trips; what pgbench reports
//               is its average latency, not a median)
// CONNINFO defaults to $BULKHEAD_TEST_DATABASE. The default plan is
// 0:4,100:4,500:16, 5 rounds of 3 s. Writes PATH.md and PATH.csv (default
// bench/results/rtt); the table also goes to stdout, progress to stderr.
#include "arms.hpp"
#include "conninfo.hpp"
#include "load.hpp"
#include "wire_counter.hpp"

#include <bulkhead/pqxx/conninfo.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace bulkhead_bench {
namespace {

using namespace std::chrono_literals;

struct step {
    int delay_us = 0;
    int threads = 4;
};

struct settings {
    std::string conninfo;
    std::vector<step> plan{{0, 4}, {100, 4}, {500, 16}};
    int rounds = 5;
    double seconds = 3.0;
    std::string pgbench = "pgbench";
    std::string prefix = "bench/results/rtt";
};

/// One arm's run at one delay.
struct sample {
    double calls_per_s = 0;
    double p50_us = 0;
    double p99_us = 0;
    double round_trips = 0;  ///< per transaction, counted on the wire
};

void progress(const std::string& text) { std::fprintf(stderr, "bulkhead_rtt_bench: %s\n", text.c_str()); }

std::string fixed(double value, int decimals) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
    return buffer;
}

std::unique_ptr<arm> make_arm(const std::string& which, const std::string& conninfo, int threads) {
    if (which == "raw") {
        return std::make_unique<raw_arm>(conninfo, workload::select1, threads);
    }
    // The gate with the pool's defaults (read-write, outcome tracked, the
    // session reset), no deadline; one worker per caller thread.
    gate_settings gate{.name = which,
                       .concurrent = threads,
                       .extra_slots = threads,
                       .queue_wait = 1s,
                       .deadline = std::chrono::nanoseconds::zero(),
                       .read_only = false,
                       .deferred_begin = which == "gate-deferred",
                       .execute = which == "gate-execute",
                       .workers = threads};
    return std::make_unique<gate_arm>(conninfo, workload::select1, gate);
}

sample run_arm(const std::string& which, const std::string& conninfo, wire_counter& relay, int threads, double seconds,
               std::uint64_t seed) {
    std::unique_ptr<arm> target = make_arm(which, relay.for_clients(conninfo), threads);
    const auto warm_up = 250ms;
    const auto window = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
    const std::uint64_t trips_before = relay.round_trips();
    const run_records records = run_closed_loop(*target, threads, warm_up + window, seed);
    const std::uint64_t trips = relay.round_trips() - trips_before;
    std::vector<std::int64_t> latencies;
    std::uint64_t completed_all = 0;
    for (const record& call : records.calls) {
        if (call.what != outcome::completed) {
            continue;
        }
        ++completed_all;
        const std::int64_t ended = call.began_ns + call.call_ns;
        if (ended > std::chrono::nanoseconds(warm_up).count() && ended <= (warm_up + window).count()) {
            latencies.push_back(call.call_ns);
        }
    }
    sample result;
    result.calls_per_s = static_cast<double>(latencies.size()) / std::chrono::duration<double>(window).count();
    result.p50_us = quantile(latencies, 0.50) / 1e3;
    result.p99_us = quantile(latencies, 0.99) / 1e3;
    result.round_trips = completed_all == 0 ? 0 : static_cast<double>(trips) / static_cast<double>(completed_all);
    return result;
}

/// Runs pgbench through the relay; its transactions per second, average
/// latency and the round trips per transaction.
sample run_pgbench(const settings& config, wire_counter& relay, int threads) {
    const conninfo_fields fields = parse_conninfo(config.conninfo);
    const auto field = [&](const char* keyword, const char* fallback) {
        const auto found = fields.find(keyword);
        return found != fields.end() ? found->second : std::string(fallback);
    };
    char script_path[] = "/tmp/bulkhead-rtt-XXXXXX.sql";
    const int script_fd = ::mkstemps(script_path, 4);
    if (script_fd < 0) {
        throw std::runtime_error("cannot make a temporary pgbench script");
    }
    const std::string script = "BEGIN;\nSELECT 1;\nCOMMIT;\n";
    const bool written = ::write(script_fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
    ::close(script_fd);
    if (!written) {
        ::unlink(script_path);
        throw std::runtime_error("cannot write the pgbench script");
    }
    const std::string seconds = std::to_string(static_cast<int>(config.seconds + 0.999));
    const std::string clients = std::to_string(threads);
    const std::string port = std::to_string(relay.port());
    const std::string user = field("user", "postgres");
    const std::string database = field("dbname", user.c_str());
    std::vector<std::string> arguments = {config.pgbench, "-n",    "-c", clients,     "-j",    clients,
                                          "-T",           seconds, "-f", script_path, "-h",    "127.0.0.1",
                                          "-p",           port,    "-U", user,        database};
    std::vector<char*> argv;
    for (std::string& argument : arguments) {
        argv.push_back(argument.data());
    }
    argv.push_back(nullptr);
    // The password reaches pgbench through its environment, never its command line.
    std::vector<std::string> environment;
    for (char** each = environ; *each != nullptr; ++each) {
        if (std::string_view(*each).substr(0, 11) != "PGPASSWORD=") {
            environment.emplace_back(*each);
        }
    }
    environment.push_back("PGPASSWORD=" + field("password", ""));
    environment.emplace_back("PGSSLMODE=disable");
    environment.emplace_back("PGGSSENCMODE=disable");
    std::vector<char*> envp;
    for (std::string& each : environment) {
        envp.push_back(each.data());
    }
    envp.push_back(nullptr);

    int output[2];
    if (::pipe(output) != 0) {
        ::unlink(script_path);
        throw std::runtime_error("pipe failed");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, output[0]);
    const std::uint64_t trips_before = relay.round_trips();
    pid_t child = 0;
    const int spawned = ::posix_spawnp(&child, config.pgbench.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(output[1]);
    std::string text;
    if (spawned == 0) {
        char buffer[4096];
        ssize_t got = 0;
        while ((got = ::read(output[0], buffer, sizeof(buffer))) > 0) {
            text.append(buffer, static_cast<std::size_t>(got));
        }
    }
    ::close(output[0]);
    int status = 0;
    if (spawned == 0) {
        ::waitpid(child, &status, 0);
    }
    ::unlink(script_path);
    const std::uint64_t trips = relay.round_trips() - trips_before;
    if (spawned != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw std::runtime_error("pgbench failed (" + config.pgbench + "):\n" + text);
    }
    const auto number_after = [&](const std::string& label) -> double {
        const std::size_t at = text.find(label);
        return at == std::string::npos ? 0.0 : std::strtod(text.c_str() + at + label.size(), nullptr);
    };
    sample result;
    result.calls_per_s = number_after("tps = ");
    result.p50_us = number_after("latency average = ") * 1e3;
    const double transactions = number_after("number of transactions actually processed: ");
    result.round_trips = transactions > 0 ? static_cast<double>(trips) / transactions : 0.0;
    return result;
}

double median_of(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t middle = values.size() / 2;
    return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

int run(const settings& config) {
    const std::vector<std::string> arms = {"raw", "gate", "gate-deferred", "gate-execute", "pgbench"};
    std::ostringstream table;
    std::ostringstream csv;
    csv << "delay_us,threads,arm,round,calls_per_s,p50_us,round_trips\n";
    table << "| one-way delay | P = B | arm | round trips per transaction | transactions/s (median; min-max) | vs raw "
             "| p50 latency |\n|---|---|---|---|---|---|---|\n";
    for (const step& at : config.plan) {
        wire_counter relay(config.conninfo, std::chrono::microseconds(at.delay_us));
        std::map<std::string, std::vector<sample>> samples;
        for (int round = 0; round < config.rounds; ++round) {
            for (std::size_t i = 0; i < arms.size(); ++i) {
                const std::string& which = arms[(i + static_cast<std::size_t>(round)) % arms.size()];
                const sample got = which == "pgbench"
                                       ? run_pgbench(config, relay, at.threads)
                                       : run_arm(which, config.conninfo, relay, at.threads, config.seconds,
                                                 static_cast<std::uint64_t>(round) * 100U + i);
                progress("D " + std::to_string(at.delay_us) + " us, P " + std::to_string(at.threads) + ", round " +
                         std::to_string(round + 1) + ", " + which + ": " + fixed(got.calls_per_s, 0) + "/s, p50 " +
                         fixed(got.p50_us, 0) + " us, p99 " + fixed(got.p99_us, 0) + " us, " +
                         fixed(got.round_trips, 2) + " round trips");
                csv << at.delay_us << ',' << at.threads << ',' << which << ',' << round + 1 << ','
                    << fixed(got.calls_per_s, 1) << ',' << fixed(got.p50_us, 1) << ',' << fixed(got.round_trips, 3)
                    << '\n';
                samples[which].push_back(got);
            }
        }
        const auto throughput = [&](const std::string& which) {
            std::vector<double> values;
            for (const sample& each : samples[which]) {
                values.push_back(each.calls_per_s);
            }
            return values;
        };
        const double raw = median_of(throughput("raw"));
        for (const std::string& which : arms) {
            const std::vector<double> values = throughput(which);
            std::vector<double> p50;
            std::vector<double> trips;
            for (const sample& each : samples[which]) {
                p50.push_back(each.p50_us);
                trips.push_back(each.round_trips);
            }
            const double median = median_of(values);
            table << "| " << at.delay_us << " µs | " << at.threads << " | " << which << " | "
                  << fixed(median_of(trips), 2) << " | " << fixed(median, 0) << " ("
                  << fixed(*std::min_element(values.begin(), values.end()), 0) << "-"
                  << fixed(*std::max_element(values.begin(), values.end()), 0) << ") | " << fixed(median / raw, 2)
                  << "x | " << fixed(median_of(p50), 0) << " µs" << (which == "pgbench" ? " (mean)" : "") << " |\n";
        }
    }
    std::printf("%s", table.str().c_str());
    std::ofstream(config.prefix + ".md") << "# One-statement transactions across a network\n\n"
                                         << "`scripts/bench-rtt`: " << config.rounds << " interleaved rounds of "
                                         << config.seconds << " s per arm and delay.\n\n"
                                         << table.str();
    std::ofstream(config.prefix + ".csv") << csv.str();
    progress("wrote " + config.prefix + ".md and .csv");
    return 0;
}

int usage() {
    std::fputs(
        "usage: bulkhead_rtt_bench [--conninfo CONNINFO] [--delays D:P,...] [--rounds N] [--seconds S] "
        "[--pgbench PATH] [--prefix PATH]\n",
        stderr);
    return 2;
}

/// "0:4,100:4,500:16": one-way delays in microseconds, each with its caller count.
std::optional<std::vector<step>> parse_plan(const std::string& text) {
    std::vector<step> plan;
    std::istringstream parts(text);
    std::string part;
    while (std::getline(parts, part, ',')) {
        const std::size_t colon = part.find(':');
        if (colon == std::string::npos) {
            return std::nullopt;
        }
        char* end = nullptr;
        const long delay = std::strtol(part.c_str(), &end, 10);
        const long threads = std::strtol(part.c_str() + colon + 1, nullptr, 10);
        if (end != part.c_str() + colon || delay < 0 || delay > 100000 || threads < 1 || threads > 256) {
            return std::nullopt;
        }
        plan.push_back({static_cast<int>(delay), static_cast<int>(threads)});
    }
    if (plan.empty()) {
        return std::nullopt;
    }
    return plan;
}

}  // namespace
}  // namespace bulkhead_bench

int main(int argc, char** argv) {
    using namespace bulkhead_bench;
    settings config;
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        const bool has_value = i + 1 < argc;
        if (argument == "--conninfo" && has_value) {
            config.conninfo = argv[++i];
        } else if (argument == "--delays" && has_value) {
            const std::optional<std::vector<step>> plan = parse_plan(argv[++i]);
            if (!plan) {
                std::fprintf(stderr, "bulkhead_rtt_bench: --delays wants D:P,... (D in us, 0-100000; P 1-256)\n");
                return usage();
            }
            config.plan = *plan;
        } else if (argument == "--rounds" && has_value) {
            config.rounds = std::atoi(argv[++i]);
        } else if (argument == "--seconds" && has_value) {
            config.seconds = std::atof(argv[++i]);
        } else if (argument == "--pgbench" && has_value) {
            config.pgbench = argv[++i];
        } else if (argument == "--prefix" && has_value) {
            config.prefix = argv[++i];
        } else {
            return usage();
        }
    }
    if (config.rounds < 1 || config.seconds <= 0) {
        return usage();
    }
    if (config.conninfo.empty()) {
        if (const char* from_environment = std::getenv("BULKHEAD_TEST_DATABASE")) {
            config.conninfo = from_environment;
        }
    }
    if (config.conninfo.empty()) {
        std::fputs("bulkhead_rtt_bench: no database: pass --conninfo or set BULKHEAD_TEST_DATABASE\n", stderr);
        return usage();
    }
    try {
        return run(config);
    } catch (const std::exception& failure) {
        std::fprintf(stderr, "bulkhead_rtt_bench: %s\n", bulkhead::redact_conninfo(failure.what()).c_str());
        return 1;
    }
}
