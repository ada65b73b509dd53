// bulkhead_deadlines_bench: what G8's early rejection saves the database
// (docs/deadlines.md, docs/performance.md "What early rejection saves the database",
// scripts/bench-deadlines).
//
// An overloaded gate: B permits over a pool of B, C closed-loop callers, each
// call `SELECT pg_sleep(work)` with a deadline D from its start (queue wait D
// too). The pool sets statement_timeout to the time left, so a call that gets
// its permit late starts its work on the server and is cut short there: that
// work is database time spent on a call that fails anyway. Two arms, run
// alternately for each D, the same server and load:
//   wait     reject_unreachable_deadline = false: every call waits up to its
//            deadline;
//   refuse   reject_unreachable_deadline = true (the default): a call whose
//            deadline is shorter than the expected queue wait is refused at
//            admission (G8).
// For each it records, per second: calls committed within their deadline
// (goodput), calls refused (early, or after waiting), calls started and cut
// short by the deadline, and the database time those cut-short calls used
// (the callback's time until the server cancelled it): the waste G8 saves.
//
//   BULKHEAD_TEST_DATABASE=... bulkhead_deadlines_bench --prefix PATH
//       [--concurrent 4] [--callers 24] [--work-ms 20] [--deadlines 40,80,160] [--seconds 10]
#include "load.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using steady = std::chrono::steady_clock;

struct settings {
    std::string prefix;
    int concurrent = 4;
    int callers = 24;
    int work_ms = 20;
    int seconds = 10;
    std::vector<int> deadlines{40, 80, 160};
};

struct arm_result {
    std::string arm;
    int deadline_ms = 0;
    double seconds = 0;
    long committed = 0;
    long refused_early = 0;
    long refused_waiting = 0;  // deadline or queue timeout after waiting, pool timeout
    long cut_short = 0;        // started, then cut short by the deadline
    long other_failures = 0;
    double useful_db_ms = 0;  // callback time of committed calls
    double wasted_db_ms = 0;  // callback time of cut-short calls
};

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            throw std::invalid_argument("bulkhead_deadlines_bench: " + flag + " needs a value");
        }
        const std::string value = argv[++i];
        if (flag == "--prefix") {
            s.prefix = value;
        } else if (flag == "--concurrent") {
            s.concurrent = bulkhead_bench::positive_argument(flag, value);
        } else if (flag == "--callers") {
            s.callers = bulkhead_bench::positive_argument(flag, value);
        } else if (flag == "--work-ms") {
            s.work_ms = bulkhead_bench::positive_argument(flag, value);
        } else if (flag == "--seconds") {
            s.seconds = bulkhead_bench::positive_argument(flag, value);
        } else if (flag == "--deadlines") {
            s.deadlines.clear();
            std::stringstream list(value);
            std::string item;
            while (std::getline(list, item, ',')) {
                s.deadlines.push_back(bulkhead_bench::positive_argument(flag, item));
            }
        } else {
            throw std::invalid_argument("bulkhead_deadlines_bench: unknown option " + flag.substr(0, 30));
        }
    }
    if (s.prefix.empty()) {
        throw std::invalid_argument("bulkhead_deadlines_bench: --prefix PATH is required");
    }
    return s;
}

double milliseconds_since(steady::time_point start) {
    return std::chrono::duration<double, std::milli>(steady::now() - start).count();
}

arm_result run_arm(const settings& s, const std::string& conninfo, bool refuse_early, int deadline_ms) {
    bulkhead::pqxx_pool pool({.conninfo = conninfo,
                              .max_size = static_cast<std::size_t>(s.concurrent),
                              .connection_timeout = 5s,
                              .application_name = "bulkhead-bench-deadlines"});
    gate_t gate(pool, s.concurrent, s.callers);
    const std::string work = "SELECT pg_sleep(" + std::to_string(static_cast<double>(s.work_ms) / 1000.0) + ")";
    // Warm the pool and the gate's mean hold outside the measurement.
    for (int i = 0; i < s.concurrent; ++i) {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) { tx.exec(work); });
    }
    std::atomic<long> committed{0};
    std::atomic<long> cut_short{0};
    std::atomic<long> other_failures{0};
    std::atomic<long> refused{0};
    std::atomic<std::int64_t> useful_us{0};
    std::atomic<std::int64_t> wasted_us{0};
    const bulkhead::gate_stats before = gate.stats();
    const auto start = steady::now();
    const auto end = start + std::chrono::seconds(s.seconds);
    std::vector<std::thread> callers;
    callers.reserve(static_cast<std::size_t>(s.callers));
    for (int c = 0; c < s.callers; ++c) {
        callers.emplace_back([&] {
            while (steady::now() < end) {
                const auto deadline = steady::now() + std::chrono::milliseconds(deadline_ms);
                steady::time_point began{};
                try {
                    const auto done = gate.try_transaction({.queue_wait = std::chrono::milliseconds(deadline_ms),
                                                            .deadline = deadline,
                                                            .reject_unreachable_deadline = refuse_early},
                                                           [&](pqxx::dbtransaction& tx) {
                                                               began = steady::now();
                                                               tx.exec(work);
                                                           });
                    if (done) {
                        committed.fetch_add(1);
                        useful_us.fetch_add(static_cast<std::int64_t>(milliseconds_since(began) * 1e3));
                    } else {
                        refused.fetch_add(1);
                        std::this_thread::sleep_for(2ms);  // a refused caller's back-off, as a client's
                    }
                } catch (const bulkhead::work_deadline_exceeded&) {
                    cut_short.fetch_add(1);
                    if (began != steady::time_point{}) {
                        wasted_us.fetch_add(static_cast<std::int64_t>(milliseconds_since(began) * 1e3));
                    }
                } catch (const std::exception&) {
                    other_failures.fetch_add(1);
                }
            }
        });
    }
    for (std::thread& caller : callers) {
        caller.join();
    }
    const double wall = std::chrono::duration<double>(steady::now() - start).count();
    const bulkhead::gate_stats after = gate.stats();
    arm_result r;
    r.arm = refuse_early ? "refuse" : "wait";
    r.deadline_ms = deadline_ms;
    r.seconds = wall;
    r.committed = committed.load();
    r.refused_early = static_cast<long>(after.deadline_rejected_early - before.deadline_rejected_early);
    r.refused_waiting = refused.load() - r.refused_early;
    r.cut_short = cut_short.load();
    r.other_failures = other_failures.load();
    r.useful_db_ms = static_cast<double>(useful_us.load()) / 1e3;
    r.wasted_db_ms = static_cast<double>(wasted_us.load()) / 1e3;
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const settings s = parse(argc, argv);
        const std::string database = bulkhead_bench::database_from_env("bulkhead_deadlines_bench");
        std::vector<arm_result> results;
        for (const int deadline_ms : s.deadlines) {
            for (const bool refuse_early : {false, true}) {
                const arm_result& r = results.emplace_back(run_arm(s, database, refuse_early, deadline_ms));
                std::fprintf(stderr,
                             "deadlines: D %3d ms %-6s: committed %.1f/s, refused early %.1f/s, after waiting %.1f/s, "
                             "cut short %.1f/s using %.0f ms/s of database time (useful %.0f ms/s)\n",
                             r.deadline_ms, r.arm.c_str(), static_cast<double>(r.committed) / r.seconds,
                             static_cast<double>(r.refused_early) / r.seconds,
                             static_cast<double>(r.refused_waiting) / r.seconds,
                             static_cast<double>(r.cut_short) / r.seconds, r.wasted_db_ms / r.seconds,
                             r.useful_db_ms / r.seconds);
            }
        }
        std::ofstream csv(s.prefix + ".csv");
        csv << "deadline_ms,arm,seconds,committed,refused_early,refused_waiting,cut_short,other_failures,useful_db_ms,"
               "wasted_db_ms\n";
        std::ofstream md(s.prefix + ".md");
        md << "# Early rejection (G8): the database time it saves\n\n"
           << "B = " << s.concurrent << " (pool " << s.concurrent << "), " << s.callers
           << " closed-loop callers, each call `SELECT pg_sleep(" << static_cast<double>(s.work_ms) / 1000.0
           << ")` with deadline D from its start (queue wait D), " << s.seconds << " s per cell. wait: "
           << "reject_unreachable_deadline = false; refuse: true (the default). Per second of wall time.\n\n"
           << "| D | arm | committed/s | refused early/s | refused after waiting/s | cut short/s | database time "
              "cut short, ms/s | database time committed, ms/s |\n"
           << "|---|---|---|---|---|---|---|---|\n";
        for (const arm_result& r : results) {
            csv << r.deadline_ms << ',' << r.arm << ',' << r.seconds << ',' << r.committed << ',' << r.refused_early
                << ',' << r.refused_waiting << ',' << r.cut_short << ',' << r.other_failures << ',' << r.useful_db_ms
                << ',' << r.wasted_db_ms << '\n';
            std::array<char, 256> line{};
            std::snprintf(
                line.data(), line.size(), "| %d ms | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f |\n", r.deadline_ms,
                r.arm.c_str(), static_cast<double>(r.committed) / r.seconds,
                static_cast<double>(r.refused_early) / r.seconds, static_cast<double>(r.refused_waiting) / r.seconds,
                static_cast<double>(r.cut_short) / r.seconds, r.wasted_db_ms / r.seconds, r.useful_db_ms / r.seconds);
            md << line.data();
        }
        return 0;
    } catch (const std::exception& error) {
        std::cerr << bulkhead::redact_conninfo(error.what()) << '\n';
        return 1;
    }
}
