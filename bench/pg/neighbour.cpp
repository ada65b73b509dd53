// bulkhead_neighbour_bench: a fixed and an adaptive gate under a noisy
// neighbour (docs/adaptive.md, "The noisy neighbour").
//
//   bulkhead_neighbour_bench [--conninfo CONNINFO] --pgbench PATH --prefix PATH [--phase SECONDS] [--quick]
//                            [--queue-allowance X] [--floor N] [--rounds N]
//                            [--neighbour-clients N]
//
// CONNINFO defaults to $BULKHEAD_TEST_DATABASE (scripts/bench-neighbour
// starts a throwaway server and passes it so, keeping the password out of
// argv).
// The service's load is open loop: Poisson arrivals at 70 % of what the gate
// at B = 4 completes in a closed loop on a quiet server, each a read/write
// transaction (UPDATE one row, SELECT another) with a 250 ms deadline and a
// 50 ms queue wait, 256 callers. The neighbour is pgbench (-c 4 -j 2;
// --neighbour-clients N: -c N, -j 2 at most) running
// a CPU-heavy scan (a LIKE over 200,000 rows) against the same server,
// which has two cores.
//
// The plan:
//   1. the rate: the closed-loop capacity of a gate with B = 4, quiet;
//   2. a sweep with the neighbour on: fixed gates of B = 1, 2, 4, 8, 16 at
//      that rate, 10 s each; the best B is the one with the most goodput,
//      a larger B having to beat the best so far by 2 % (the noise);
//   3. three arms, each through 10 s of warm-up (not measured: the adaptive
//      gate's slow start) and three phases of PHASE seconds (60 by
//      default; --quick: 15): neighbour off, on, off, first under the open
//      loop, then under a closed loop of 64 callers that call again at once.
//      The arms: a fixed gate at the best B, a fixed gate at B = 64 (too
//      high), an adaptive gate with floor 1 (--floor N: N) and ceiling 64.
//      With --rounds N the three arms run N times in turn (A B C A B C ...)
//      within each loop, and the report adds each round's neighbour-phase
//      ratios and their median: the neighbour's share of the two cores
//      varies between runs, so one arm after another can differ by more
//      than the arms themselves do.
// Results: PREFIX-neighbour.csv (every loop and arm, 0.5 s buckets: goodput,
// p99 of admitted calls, rejections, the limit and the adaptive limit's
// latency baseline), PREFIX-neighbour.md (the tables, with pgbench's
// transactions per second beside each arm's neighbour phase), also printed
// on stdout; progress on stderr. About 21 minutes (--quick: about 7;
// --rounds N: N times as long).
#include "arms.hpp"
#include "conninfo.hpp"
#include "load.hpp"

#include <bulkhead/adaptive_limit.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bulkhead_bench {
namespace {

constexpr auto call_deadline = 250ms;
constexpr int too_high = 64;
constexpr int closed_callers = 64;  ///< the closed loop's callers, each calling again at once
/// Each arm runs this long before its quiet phase, unmeasured: the adaptive
/// gate's slow start from its floor (about 5 s) would otherwise be the
/// quiet phase's p99, and the neighbour phase's p99 would be compared with
/// it instead of with the gate's quiet steady state.
constexpr auto warm_up = 10s;

struct settings {
    std::string conninfo;
    std::string pgbench;
    std::string prefix;
    std::chrono::seconds phase{60};
    /// The adaptive arm's settings: the library's defaults unless
    /// --queue-allowance or --floor names another.
    bulkhead::adaptive_options adaptive;
    int rounds = 1;  ///< how many times the arms run in turn in each loop
    /// pgbench's clients (-c); its threads (-j) are min(clients, 2).
    int neighbour_clients = 4;
};

/// A gate in front of its own pool, fixed or adaptive; one call per job.
class neighbour_arm final : public arm {
public:
    neighbour_arm(const settings& config, std::string name, int permits, bool adaptive)
        : m_name(std::move(name)),
          m_pool(pool_settings(config.conninfo, permits, 1000ms)),
          m_gate(make_gate(m_pool, permits, adaptive, config)) {}

    [[nodiscard]] std::string label() const override { return m_name; }
    [[nodiscard]] int workers() const override { return 256; }

    call_result call(int /*worker*/, clock::time_point intended, api /*which*/, std::mt19937_64& random) override {
        call_result result{.began = clock::now()};
        try {
            const bulkhead::result<long> answer = m_gate.try_transaction(
                {.queue_wait = 50ms, .deadline = intended + call_deadline},
                [&](pqxx::dbtransaction& tx) { return run_statements(tx, workload::read_write, random); });
            result.what = answer ? outcome::completed : classify(answer.error());
        } catch (const bulkhead::work_deadline_exceeded&) {
            result.what = outcome::cut_by_deadline;
        } catch (const std::exception& failure) {
            report_failure(m_name.c_str(), failure);
            result.what = outcome::failed;
        }
        result.ended = clock::now();
        return result;
    }

    [[nodiscard]] int limit() const noexcept { return m_gate.limit(); }
    /// The adaptive limit's latency baseline (zero for a fixed gate).
    [[nodiscard]] std::chrono::nanoseconds baseline() const { return m_gate.stats().latency_baseline; }
    /// The gate's running mean permit hold, and why its limit last changed.
    [[nodiscard]] std::pair<std::chrono::nanoseconds, bulkhead::limit_reason> hold_and_reason() const {
        const bulkhead::gate_stats stats = m_gate.stats();
        return {stats.mean_permit_hold, stats.limit_reason};
    }

private:
    using gate_type = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

    static gate_type make_gate(bulkhead::pqxx_pool& pool, int permits, bool adaptive, const settings& config) {
        return gate_type(pool, {.concurrent = permits,
                                .extra_slots = 64,
                                .adaptive = adaptive ? std::optional(config.adaptive) : std::nullopt});
    }

    std::string m_name;
    bulkhead::pqxx_pool m_pool;
    gate_type m_gate;
};

void progress(const std::string& text) { std::fprintf(stderr, "neighbour: %s\n", text.c_str()); }

/// The neighbour's table and script. Refuses, before any arm runs, a
/// neighbour whose clients and the B = 64 arm's connections would not fit
/// in the server's max_connections (less its reserved ones and those other
/// clients hold): pgbench would fail minutes into the run.
std::string prepare_neighbour(const std::string& conninfo, const std::string& prefix, int clients) {
    pqxx::connection connection(conninfo);
    {
        pqxx::nontransaction tx(connection);
        // PostgreSQL 16 adds reserved_connections; current_setting(.., true)
        // is NULL where it does not exist. The connections of other clients
        // count too.
        const int allowed = tx.exec(
                                  "SELECT current_setting('max_connections')::int"
                                  " - current_setting('superuser_reserved_connections')::int"
                                  " - coalesce(current_setting('reserved_connections', true)::int, 0)"
                                  " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                                  " AND pid <> pg_backend_pid())::int")[0][0]
                                .as<int>();
        const int needed = clients + too_high + 2;  // pgbench's and the B = 64 arm's pool, and a margin of 2
        if (needed > allowed) {
            throw std::invalid_argument("--neighbour-clients " + std::to_string(clients) +
                                        ": pgbench's clients and "
                                        "the B = 64 arm's connections need " +
                                        std::to_string(needed) + ", and the server takes " + std::to_string(allowed) +
                                        " (max_connections less the reserved ones and those in use)");
        }
    }
    {
        pqxx::work tx(connection);
        tx.exec("DROP TABLE IF EXISTS bench_neighbour");
        tx.exec(
            "CREATE TABLE bench_neighbour AS SELECT g AS id, md5(g::text) AS pad FROM generate_series(1, 200000) g");
        tx.commit();
    }
    pqxx::nontransaction(connection).exec("VACUUM ANALYZE bench_neighbour");
    std::string script = prefix + "-neighbour.sql";
    std::ofstream(script) << "SELECT count(*) FROM bench_neighbour WHERE pad LIKE '%abc%';\n";
    return script;
}

/// Runs pgbench for `length` on another thread.
class neighbour {
public:
    /// The password goes to pgbench through PGPASSWORD (set once by
    /// run()), not on its command line, where ps would show it.
    neighbour(const settings& config, const std::string& script, std::chrono::seconds length) {
        m_log = config.prefix + "-pgbench.log";
        const std::string& log = m_log;
        const int clients = config.neighbour_clients;
        const std::string command = config.pgbench + " -n -c " + std::to_string(clients) + " -j " +
                                    std::to_string(std::min(clients, 2)) + " -T " + std::to_string(length.count()) +
                                    " -f " + script + " '" + with_field(config.conninfo, "password", "") + "' >>" +
                                    log + " 2>&1";
        m_thread = std::thread([command, log] {
            // NOLINTNEXTLINE(cert-env33-c,concurrency-mt-unsafe): the benchmark's own child, a fixed command
            if (std::system(command.c_str()) != 0) {
                // Figures without the neighbour would be wrong, not just missing.
                std::fprintf(stderr, "bulkhead_neighbour_bench: pgbench failed (see %s); no results\n", log.c_str());
                std::_Exit(1);
            }
        });
    }
    neighbour(const neighbour&) = delete;
    neighbour& operator=(const neighbour&) = delete;
    ~neighbour() { wait(); }

    /// Waits for pgbench to end; then its transactions per second, the
    /// last "tps = " line of its log (0 if there is none).
    double wait_for_tps() {
        wait();
        std::ifstream in(m_log);
        double tps = 0;
        for (std::string line; std::getline(in, line);) {
            if (line.rfind("tps = ", 0) == 0) {
                tps = std::strtod(line.c_str() + 6, nullptr);
            }
        }
        return tps;
    }

private:
    void wait() {
        if (m_thread.joinable()) {
            m_thread.join();
        }
    }

    std::string m_log;
    std::thread m_thread;
};

/// One sample of the limit and its baseline.
struct limit_sample {
    std::int64_t t_ns = 0;  ///< since the start
    int limit = 0;
    std::int64_t baseline_ns = 0;
    std::int64_t mean_hold_ns = 0;  ///< the gate's running mean permit hold
    bulkhead::limit_reason reason = bulkhead::limit_reason::initial;
};

/// The limit and the latency baseline every 100 ms.
class limit_sampler {
public:
    explicit limit_sampler(const neighbour_arm& target) {
        m_thread = std::thread([this, &target] {
            const clock::time_point start = clock::now();
            while (!m_stop.load()) {
                const auto [hold, reason] = target.hold_and_reason();
                m_samples.push_back({.t_ns = nanoseconds_between(start, clock::now()),
                                     .limit = target.limit(),
                                     .baseline_ns = target.baseline().count(),
                                     .mean_hold_ns = hold.count(),
                                     .reason = reason});
                std::this_thread::sleep_for(100ms);  // the sampling period
            }
        });
    }
    limit_sampler(const limit_sampler&) = delete;
    limit_sampler& operator=(const limit_sampler&) = delete;
    ~limit_sampler() { stop(); }
    std::vector<limit_sample>& stop() {
        m_stop.store(true);
        if (m_thread.joinable()) {
            m_thread.join();
        }
        return m_samples;
    }

private:
    std::atomic<bool> m_stop{false};
    std::vector<limit_sample> m_samples;  // written by the thread, read after stop()
    std::thread m_thread;
};

/// The sample at `at_ns`: the last at or before it (the first before any).
limit_sample sample_at(const std::vector<limit_sample>& samples, std::int64_t at_ns) {
    limit_sample found = samples.empty() ? limit_sample{} : samples.front();
    for (const limit_sample& sample : samples) {
        if (sample.t_ns > at_ns) {
            break;
        }
        found = sample;
    }
    return found;
}

struct phase_row {
    std::string loop;
    int round = 1;
    int arm_index = 0;  ///< 0: the best fixed B, 1: the too-high one, 2: adaptive
    std::string arm;
    std::string phase;
    run_summary summary;
    double limit_median = 0;
    double baseline_median_ms = 0;  ///< the adaptive limit's latency baseline (0: a fixed gate)
    double settle_s = 0;       ///< after the step: until the limit stays within [0.8, 1.25] x the phase median for 2 s
    double overshoot = 0;      ///< the highest limit in the phase over its median
    double neighbour_tps = 0;  ///< the neighbour phase: pgbench's transactions per second beside this arm
};

std::string format(const char* pattern, auto... values) {
    std::array<char, 512> buffer{};
    (void)std::snprintf(buffer.data(), buffer.size(), pattern, values...);
    return buffer.data();
}

/// One phase's figures, [from, from + length) of the run: its summary, and
/// the limit's median, overshoot and settling time and the baseline's
/// median from the samples; the caller names the row.
phase_row phase_figures(const run_records& records, const std::vector<limit_sample>& samples, std::int64_t from,
                        std::int64_t length) {
    const std::int64_t to = from + length;
    phase_row row;
    row.summary = summarize(records.calls, call_deadline, static_cast<double>(length) / 1e9, from, to);
    std::vector<int> limits;
    std::vector<std::int64_t> baselines;
    for (const limit_sample& sample : samples) {
        if (sample.t_ns >= from && sample.t_ns < to) {
            limits.push_back(sample.limit);
            baselines.push_back(sample.baseline_ns);
        }
    }
    row.baseline_median_ms = baselines.empty() ? 0.0 : quantile(baselines, 0.5) / 1e6;
    if (limits.empty()) {
        return row;
    }
    std::vector<int> sorted = limits;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    row.limit_median = median;
    row.overshoot = static_cast<double>(sorted.back()) / std::max(median, 1.0);
    // Settled: 20 samples (2 s) in a row within [0.8, 1.25] x median.
    int run_length = 0;
    row.settle_s = static_cast<double>(length) / 1e9;
    for (std::size_t k = 0; k < limits.size(); ++k) {
        const double value = limits[k];
        run_length = (value >= 0.8 * median && value <= 1.25 * median) ? run_length + 1 : 0;
        if (run_length == 20) {
            row.settle_s = static_cast<double>(k + 1 - 20) / 10.0;
            break;
        }
    }
    return row;
}

/// The run's CSV lines, one per 0.5 s of [start, start + length), their
/// times counted from `start`.
void write_buckets(std::ostream& csv, const char* loop, const std::string& arm, const run_records& records,
                   const std::vector<limit_sample>& samples, std::int64_t start, std::int64_t length) {
    const std::int64_t bucket = 500'000'000;
    for (std::int64_t from = start; from < start + length; from += bucket) {
        const run_summary s = summarize(records.calls, call_deadline, 0.5, from, from + bucket);
        const limit_sample at = sample_at(samples, from + bucket / 2);
        csv << format("%s,%s,%.2f,%.1f,%.3f,%.1f,%d,%.3f,%.3f,%s\n", loop, arm.c_str(),
                      (static_cast<double>(from - start) + static_cast<double>(bucket) / 2.0) / 1e9, s.goodput,
                      s.admitted_p99_ms, static_cast<double>(s.rejected_full + s.rejected_wait) / 0.5, at.limit,
                      static_cast<double>(at.baseline_ns) / 1e6, static_cast<double>(at.mean_hold_ns) / 1e6,
                      std::string(bulkhead::to_string(at.reason)).c_str());
    }
}

/// The row of `loop`, `round`, arm `arm_index` and phase `phase`.
const phase_row& row_of(const std::vector<phase_row>& rows, const std::string& loop, int round, int arm_index,
                        const std::string& phase) {
    for (const phase_row& row : rows) {
        if (row.loop == loop && row.round == round && row.arm_index == arm_index && row.phase == phase) {
            return row;
        }
    }
    throw std::logic_error("no row for " + loop + " round " + std::to_string(round));
}

/// Each round's neighbour-phase figures, the ratios the goals are stated
/// in, and their median over the rounds (with --rounds).
std::string rounds_report(const std::vector<phase_row>& rows, int rounds) {
    std::ostringstream out;
    out << "\n## The rounds (the neighbour phase)\n\n"
        << "| loop | round | goodput: best fixed B, B = 64, adaptive | adaptive / best fixed B | p99 neighbour / "
           "quiet: "
           "best fixed B, adaptive | the neighbour's tps: best fixed B, B = 64, adaptive "
           "|\n|---|---|---|---|---|---|\n";
    for (const char* loop : {"open", "closed"}) {
        std::vector<double> goodput_ratios;
        std::vector<double> p99_ratios;
        for (int round = 1; round <= rounds; ++round) {
            const std::array<const phase_row*, 3> noisy = {&row_of(rows, loop, round, 0, "neighbour"),
                                                           &row_of(rows, loop, round, 1, "neighbour"),
                                                           &row_of(rows, loop, round, 2, "neighbour")};
            const auto quiet_p99 = [&](int arm) {
                return row_of(rows, loop, round, arm, "quiet").summary.admitted_p99_ms;
            };
            const double ratio = noisy[2]->summary.goodput / std::max(noisy[0]->summary.goodput, 1.0);
            const double best_p99 = noisy[0]->summary.admitted_p99_ms / std::max(quiet_p99(0), 0.001);
            const double adaptive_p99 = noisy[2]->summary.admitted_p99_ms / std::max(quiet_p99(2), 0.001);
            goodput_ratios.push_back(ratio);
            p99_ratios.push_back(adaptive_p99);
            out << format("| %s | %d | %.0f, %.0f, %.0f | %.2f | %.2fx, %.2fx | %.1f, %.1f, %.1f |\n", loop, round,
                          noisy[0]->summary.goodput, noisy[1]->summary.goodput, noisy[2]->summary.goodput, ratio,
                          best_p99, adaptive_p99, noisy[0]->neighbour_tps, noisy[1]->neighbour_tps,
                          noisy[2]->neighbour_tps);
        }
        std::sort(goodput_ratios.begin(), goodput_ratios.end());
        std::sort(p99_ratios.begin(), p99_ratios.end());
        // The middle one, or the mean of the middle two.
        const auto median = [](const std::vector<double>& sorted) {
            return (sorted[(sorted.size() - 1) / 2] + sorted[sorted.size() / 2]) / 2.0;
        };
        out << format("| %s | median (lowest, highest) | | %.2f (%.2f, %.2f) | adaptive %.2fx (%.2fx, %.2fx) | |\n",
                      loop, median(goodput_ratios), goodput_ratios.front(), goodput_ratios.back(), median(p99_ratios),
                      p99_ratios.front(), p99_ratios.back());
    }
    return out.str();
}

int run(const settings& config) {
    tighten_timer_slack();
    const conninfo_fields fields = parse_conninfo(config.conninfo);
    if (const auto password = fields.find("password"); password != fields.end()) {
        // NOLINTNEXTLINE(concurrency-mt-unsafe): for pgbench, before any thread starts
        (void)::setenv("PGPASSWORD", password->second.c_str(), 1);
    }
    prepare_database(config.conninfo);
    const std::string script = prepare_neighbour(config.conninfo, config.prefix, config.neighbour_clients);

    // 1. The rate.
    double capacity = 0;
    {
        neighbour_arm probe(config, "probe", 4, false);
        const run_records records = run_closed_loop(probe, 64, 3s, 1);
        capacity = summarize(records.calls, 10s, records.window_s).throughput;
    }
    const double rate = 0.7 * capacity;
    progress(format("quiet capacity at B = 4: %.0f calls/s; offered %.0f calls/s", capacity, rate));

    // 2. The sweep, the neighbour on.
    int best = 1;
    double best_goodput = -1;
    std::ostringstream sweep;
    sweep << "| B | goodput (calls/s) | p99 of admitted (ms) | rejected |\n|---|---|---|---|\n";
    for (const int permits : {1, 2, 4, 8, 16}) {
        neighbour_arm target(config, "sweep", permits, false);
        const neighbour noisy(config, script, 12s);
        std::this_thread::sleep_for(1s);  // the neighbour's start-up; the phase length is the experiment
        open_loop_plan plan{.arrivals_ns = poisson_arrivals({{10s, rate}}, 7), .window = 10s, .alternate_api = false};
        const run_records records = run_open_loop(target, plan);
        const run_summary s = summarize(records.calls, call_deadline, records.window_s);
        sweep << format("| %d | %.0f | %.1f | %.1f %% |\n", permits, s.goodput, s.admitted_p99_ms,
                        100.0 * s.share(s.rejected_full + s.rejected_wait));
        progress(format("sweep B = %d: goodput %.0f/s, p99 %.1f ms", permits, s.goodput, s.admitted_p99_ms));
        if (s.goodput > best_goodput * 1.02) {  // a larger B must do better than the noise
            best_goodput = s.goodput;
            best = permits;
        }
    }

    // 3. The arms, off / on / off.
    struct arm_plan {
        std::string name;
        int permits;
        bool adaptive;
    };
    const std::vector<arm_plan> arms = {
        {"fixed best B = " + std::to_string(best), best, false},
        {"fixed B = " + std::to_string(too_high), too_high, false},
        {"adaptive (" + std::to_string(config.adaptive.floor) + "..64)", too_high, true}};
    const std::int64_t phase_ns = std::chrono::nanoseconds(config.phase).count();
    const std::int64_t warm_up_ns = std::chrono::nanoseconds(warm_up).count();
    std::vector<phase_row> rows;
    std::ofstream csv(config.prefix + "-neighbour.csv");
    csv << "loop,arm,t_s,goodput,admitted_p99_ms,rejected_rate,limit,baseline_ms,mean_hold_ms,limit_reason\n";
    std::uint64_t seed = 11;
    for (const char* loop : {"open", "closed"}) {
        for (int round = 1; round <= config.rounds; ++round) {
            for (std::size_t arm_index = 0; arm_index < arms.size(); ++arm_index) {
                const arm_plan& plan_of_arm = arms[arm_index];
                const std::string arm_name =
                    plan_of_arm.name + (config.rounds > 1 ? " #" + std::to_string(round) : std::string());
                neighbour_arm target(config, arm_name, plan_of_arm.permits, plan_of_arm.adaptive);
                progress(std::string(loop) + " loop, arm " + arm_name);
                limit_sampler sampler(target);
                std::optional<neighbour> noisy;
                std::thread starter([&] {
                    std::this_thread::sleep_for(warm_up + config.phase);  // then the neighbour's phase
                    noisy.emplace(config, script, config.phase);
                });
                const std::chrono::nanoseconds window = warm_up + 3 * config.phase;
                open_loop_plan plan{.arrivals_ns = poisson_arrivals({{window, rate}}, seed++),
                                    .window = window,
                                    .alternate_api = false};
                const run_records records = std::string(loop) == "open"
                                                ? run_open_loop(target, plan)
                                                : run_closed_loop(target, closed_callers, window, seed);
                starter.join();
                const double neighbour_tps = noisy ? noisy->wait_for_tps() : 0.0;
                noisy.reset();
                const auto& samples = sampler.stop();
                const char* names[] = {"quiet", "neighbour", "quiet again"};
                for (int i = 0; i < 3; ++i) {
                    phase_row row = phase_figures(records, samples, warm_up_ns + i * phase_ns, phase_ns);
                    row.loop = loop;
                    row.round = round;
                    row.arm_index = static_cast<int>(arm_index);
                    row.arm = arm_name;
                    row.phase = names[i];
                    row.neighbour_tps = i == 1 ? neighbour_tps : 0.0;
                    rows.push_back(std::move(row));
                }
                write_buckets(csv, loop, arm_name, records, samples, warm_up_ns, 3 * phase_ns);
            }
        }
    }

    std::ostringstream report;
    report << "# Noisy neighbour\n\nOffered: " << format("%.0f", rate)
           << " calls/s (70 % of the quiet capacity at B = 4, " << format("%.0f", capacity)
           << " calls/s); deadline 250 ms; phases of " << config.phase.count() << " s, each arm's after "
           << warm_up.count() << " s of warm-up that is not measured; the adaptive arm's floor "
           << config.adaptive.floor << ", queue_allowance " << format("%g", config.adaptive.queue_allowance)
           << "; the neighbour: pgbench with " << config.neighbour_clients << " clients"
           << (config.rounds > 1 ? "; the arms in " + std::to_string(config.rounds) + " rounds" : std::string())
           << ".\n\n## The sweep (neighbour on, 10 s each)\n\n"
           << sweep.str() << "\nBest B: " << best << "\n\n## The arms\n\n"
           << "| loop | arm | phase | goodput (calls/s) | p99 of admitted (ms) | rejected | limit (median) | "
              "baseline (median ms) | settled after (s) | overshoot | the neighbour's tps |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const phase_row& row : rows) {
        report << format("| %s | %s | %s | %.0f | %.1f | %.1f %% | %.0f | %.2f | %.1f | %.2f | %s |\n",
                         row.loop.c_str(), row.arm.c_str(), row.phase.c_str(), row.summary.goodput,
                         row.summary.admitted_p99_ms,
                         100.0 * row.summary.share(row.summary.rejected_full + row.summary.rejected_wait),
                         row.limit_median, row.baseline_median_ms, row.settle_s, row.overshoot,
                         row.neighbour_tps > 0 ? format("%.1f", row.neighbour_tps).c_str() : "");
    }
    if (config.rounds > 1) {
        report << rounds_report(rows, config.rounds);
    }
    std::ofstream(config.prefix + "-neighbour.md") << report.str();
    std::fputs(report.str().c_str(), stdout);
    return 0;
}

}  // namespace
}  // namespace bulkhead_bench

int main(int argc, char** argv) {
    bulkhead_bench::settings config;
    if (const char* from_environment = std::getenv("BULKHEAD_TEST_DATABASE")) {  // NOLINT(concurrency-mt-unsafe)
        config.conninfo = from_environment;                                      // the password stays out of argv
    }
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string argument = argv[i];
            const auto value = [&]() -> std::string {
                if (i + 1 >= argc) {
                    throw std::invalid_argument(argument + " needs a value");
                }
                return argv[++i];
            };
            if (argument == "--conninfo") {
                config.conninfo = value();
            } else if (argument == "--pgbench") {
                config.pgbench = value();
            } else if (argument == "--prefix") {
                config.prefix = value();
            } else if (argument == "--phase") {
                config.phase = std::chrono::seconds(bulkhead_bench::positive_argument("--phase", value()));
            } else if (argument == "--queue-allowance") {
                // 0: the hold ratio alone decides, as before the allowance.
                config.adaptive.queue_allowance = bulkhead_bench::ratio_argument("--queue-allowance", value(), 0, 100);
            } else if (argument == "--floor") {
                config.adaptive.floor = bulkhead_bench::positive_argument("--floor", value());
            } else if (argument == "--rounds") {
                config.rounds = bulkhead_bench::positive_argument("--rounds", value());
            } else if (argument == "--neighbour-clients") {
                config.neighbour_clients = bulkhead_bench::positive_argument("--neighbour-clients", value());
            } else if (argument == "--quick") {
                config.phase = std::chrono::seconds(15);
            } else {
                std::fprintf(stderr,
                             "usage: bulkhead_neighbour_bench --conninfo CONNINFO --pgbench PATH --prefix PATH "
                             "[--phase SECONDS] [--quick] [--queue-allowance X] "
                             "[--floor N] [--rounds N] [--neighbour-clients N]\n");
                return 2;
            }
        }
        // The adaptive arm's settings, checked by the library before the
        // run rather than minutes into it (a floor above the ceiling, ...).
        (void)bulkhead::limit_controller(config.adaptive, bulkhead_bench::too_high);
    } catch (const std::exception& bad) {  // a missing value, a --phase that is not a number, a floor above 64
        std::fprintf(stderr, "bulkhead_neighbour_bench: %s\n", bad.what());
        return 2;
    }
    if (config.conninfo.empty() || config.pgbench.empty() || config.prefix.empty()) {
        std::fprintf(stderr,
                     "bulkhead_neighbour_bench: --pgbench, --prefix and a connection string (--conninfo or "
                     "BULKHEAD_TEST_DATABASE) are required\n");
        return 2;
    }
    try {
        return bulkhead_bench::run(config);
    } catch (const std::exception& failure) {
        std::fprintf(stderr, "bulkhead_neighbour_bench: %s\n", failure.what());
        return 1;
    }
}
