// bulkhead_workloads_bench: batch against interactive on one gate
// (docs/workloads.md, docs/performance.md "Workload classes",
// scripts/bench-workloads).
//
// A batch load saturates the gate with long transactions (closed loop, each
// `SELECT pg_sleep(hold)` in the server, as a report's scan waiting on I/O)
// while interactive callers arrive (closed loop with think time, each a short
// `SELECT 1`, allowed `--interactive-wait` for its permit). Two arms on the
// same server, B and load:
//   shared   one plain gate of B permits and Q = 2 x B slots, everyone in it;
//   classes  the same B with workload classes: interactive reserves R permits
//            (priority 1), batch takes what is left (the shared permits).
// For each batch concurrency it prints and writes the interactive calls'
// p99 wait (from the call's start until its callback began: permit wait,
// pool, BEGIN), their p50/p99/max latency (from the call's start to its end),
// their rejection rate, and batch throughput (what the reservation costs
// batch).
//
//   BULKHEAD_TEST_DATABASE=... bulkhead_workloads_bench --prefix PATH
//       [--concurrent 8] [--reserved 2] [--seconds 10] [--batch 8,16,32]
//       [--interactive 4] [--hold-ms 50] [--interactive-wait-ms 100]
#include "load.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
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
    int concurrent = 8;
    int reserved = 2;
    int seconds = 10;
    std::vector<int> batch{8, 16, 32};
    int interactive = 4;
    int hold_ms = 50;
    int interactive_wait_ms = 100;
};

struct arm_result {
    std::string arm;
    int batch_callers = 0;
    long interactive_calls = 0;
    long interactive_refused = 0;
    double wait_p99_ms = 0;  // until the callback began
    double p50_ms = 0;
    double p99_ms = 0;
    double max_ms = 0;
    double batch_per_s = 0;
};

int positive(const std::string& name, const std::string& text) { return bulkhead_bench::positive_argument(name, text); }

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            throw std::invalid_argument("bulkhead_workloads_bench: " + flag + " needs a value");
        }
        const std::string value = argv[++i];
        if (flag == "--prefix") {
            s.prefix = value;
        } else if (flag == "--concurrent") {
            s.concurrent = positive(flag, value);
        } else if (flag == "--reserved") {
            s.reserved = positive(flag, value);
        } else if (flag == "--seconds") {
            s.seconds = positive(flag, value);
        } else if (flag == "--interactive") {
            s.interactive = positive(flag, value);
        } else if (flag == "--hold-ms") {
            s.hold_ms = positive(flag, value);
        } else if (flag == "--interactive-wait-ms") {
            s.interactive_wait_ms = positive(flag, value);
        } else if (flag == "--batch") {
            s.batch.clear();
            std::stringstream list(value);
            std::string item;
            while (std::getline(list, item, ',')) {
                s.batch.push_back(positive(flag, item));
            }
        } else {
            throw std::invalid_argument("bulkhead_workloads_bench: unknown option " + flag.substr(0, 30));
        }
    }
    if (s.prefix.empty()) {
        throw std::invalid_argument("bulkhead_workloads_bench: --prefix PATH is required");
    }
    if (s.reserved >= s.concurrent) {
        throw std::invalid_argument("bulkhead_workloads_bench: --reserved must be below --concurrent");
    }
    return s;
}

/// One arm at one batch concurrency: the gate is built by the caller.
arm_result run_arm(const settings& s, const std::string& arm, gate_t& gate, bulkhead::workload_id interactive,
                   bulkhead::workload_id batch, int batch_callers) {
    std::atomic<bool> stop{false};
    std::atomic<long> batch_done{0};
    const std::string hold = "SELECT pg_sleep(" + std::to_string(static_cast<double>(s.hold_ms) / 1000.0) + ")";
    std::vector<std::thread> threads;
    for (int i = 0; i < batch_callers; ++i) {
        threads.emplace_back([&] {
            while (!stop.load(std::memory_order_relaxed)) {
                const auto done = gate.try_transaction({.queue_wait = 10s, .workload = batch},
                                                       [&](pqxx::dbtransaction& tx) { tx.exec(hold); });
                if (done) {
                    batch_done.fetch_add(1, std::memory_order_relaxed);
                } else {
                    std::this_thread::sleep_for(5ms);  // a refused batch caller's back-off
                }
            }
        });
    }
    std::this_thread::sleep_for(1s);  // batch saturates its share before the measurement starts
    const long batch_before = batch_done.load();
    std::mutex latencies_mutex;
    std::vector<std::int64_t> latencies;
    std::vector<std::int64_t> waits;
    std::atomic<long> calls{0};
    std::atomic<long> refused{0};
    const auto end = steady::now() + std::chrono::seconds(s.seconds);
    std::vector<std::thread> interactive_threads;
    for (int i = 0; i < s.interactive; ++i) {
        interactive_threads.emplace_back([&] {
            std::vector<std::int64_t> mine;
            std::vector<std::int64_t> my_waits;
            while (steady::now() < end) {
                const auto started = steady::now();
                steady::time_point began = started;
                const auto done = gate.try_transaction(
                    {.queue_wait = std::chrono::milliseconds(s.interactive_wait_ms), .workload = interactive},
                    [&began](pqxx::dbtransaction& tx) {
                        began = steady::now();
                        tx.exec("SELECT 1");
                    });
                calls.fetch_add(1, std::memory_order_relaxed);
                if (done) {
                    mine.push_back(bulkhead_bench::nanoseconds_between(started, steady::now()));
                    my_waits.push_back(bulkhead_bench::nanoseconds_between(started, began));
                } else {
                    refused.fetch_add(1, std::memory_order_relaxed);
                }
                std::this_thread::sleep_for(10ms);  // the interactive caller's think time
            }
            const std::lock_guard lock(latencies_mutex);
            latencies.insert(latencies.end(), mine.begin(), mine.end());
            waits.insert(waits.end(), my_waits.begin(), my_waits.end());
        });
    }
    for (std::thread& thread : interactive_threads) {
        thread.join();
    }
    const long batch_measured = batch_done.load() - batch_before;
    stop.store(true);
    for (std::thread& thread : threads) {
        thread.join();
    }
    arm_result result;
    result.arm = arm;
    result.batch_callers = batch_callers;
    result.interactive_calls = calls.load();
    result.interactive_refused = refused.load();
    result.max_ms =
        latencies.empty() ? 0.0 : static_cast<double>(*std::max_element(latencies.begin(), latencies.end())) / 1e6;
    result.wait_p99_ms = bulkhead_bench::quantile(waits, 0.99) / 1e6;
    result.p50_ms = bulkhead_bench::quantile(latencies, 0.50) / 1e6;
    result.p99_ms = bulkhead_bench::quantile(latencies, 0.99) / 1e6;
    result.batch_per_s = static_cast<double>(batch_measured) / static_cast<double>(s.seconds);
    return result;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const settings s = parse(argc, argv);
        const std::string database = bulkhead_bench::database_from_env("bulkhead_workloads_bench");
        const auto pool_size = static_cast<std::size_t>(s.concurrent);
        std::vector<arm_result> results;
        for (const int batch_callers : s.batch) {
            {
                bulkhead::pqxx_pool pool({.conninfo = database,
                                          .max_size = pool_size,
                                          .connection_timeout = 5s,
                                          .application_name = "bulkhead-bench-shared"});
                gate_t gate(pool, s.concurrent, 2 * s.concurrent);
                results.push_back(run_arm(s, "shared", gate, {}, {}, batch_callers));
            }
            {
                bulkhead::pqxx_pool pool({.conninfo = database,
                                          .max_size = pool_size,
                                          .connection_timeout = 5s,
                                          .application_name = "bulkhead-bench-classes"});
                const bulkhead::workload_plan plan{{
                    {.name = "interactive", .reserved = s.reserved, .queue = 2 * s.concurrent, .priority = 1},
                    {.name = "batch", .queue = 2 * s.concurrent},
                }};
                gate_t gate(pool, {.concurrent = s.concurrent, .workloads = plan});
                results.push_back(
                    run_arm(s, "classes", gate, gate.workload("interactive"), gate.workload("batch"), batch_callers));
            }
            for (std::size_t i = results.size() - 2; i < results.size(); ++i) {
                const arm_result& r = results[i];
                std::fprintf(stderr,
                             "workloads: %-7s batch %3d: interactive wait p99 %.2f ms, p50 %.2f ms p99 %.2f ms max "
                             "%.2f ms, %ld of %ld refused; batch %.1f/s\n",
                             r.arm.c_str(), r.batch_callers, r.wait_p99_ms, r.p50_ms, r.p99_ms, r.max_ms,
                             r.interactive_refused, r.interactive_calls, r.batch_per_s);
            }
        }
        std::ofstream csv(s.prefix + ".csv");
        csv << "arm,batch_callers,interactive_calls,interactive_refused,refused_pct,wait_p99_ms,p50_ms,p99_ms,max_ms,"
               "batch_per_s\n";
        std::ofstream md(s.prefix + ".md");
        md << "# Batch against interactive on one gate\n\n"
           << "B = " << s.concurrent << " (pool " << s.concurrent << "), classes arm: interactive reserves "
           << s.reserved << " (priority 1), batch the rest; shared arm: one plain gate, Q = " << 2 * s.concurrent
           << ". Batch: closed loop, `SELECT pg_sleep(" << static_cast<double>(s.hold_ms) / 1000.0
           << ")` per transaction. Interactive: " << s.interactive
           << " callers, `SELECT 1`, 10 ms think time, queue wait " << s.interactive_wait_ms << " ms, " << s.seconds
           << " s per cell. Wait: from the call's start until its callback began (permit, connection, BEGIN); p50, "
              "p99, max: the whole call.\n\n"
           << "| arm | batch callers | interactive calls | refused | wait p99 ms | p50 ms | p99 ms | max ms | batch/s "
              "|\n"
           << "|---|---|---|---|---|---|---|---|---|\n";
        for (const arm_result& r : results) {
            const double pct = r.interactive_calls == 0 ? 0.0
                                                        : 100.0 * static_cast<double>(r.interactive_refused) /
                                                              static_cast<double>(r.interactive_calls);
            csv << r.arm << ',' << r.batch_callers << ',' << r.interactive_calls << ',' << r.interactive_refused << ','
                << pct << ',' << r.wait_p99_ms << ',' << r.p50_ms << ',' << r.p99_ms << ',' << r.max_ms << ','
                << r.batch_per_s << '\n';
            std::array<char, 256> line{};
            std::snprintf(line.data(), line.size(),
                          "| %s | %d | %ld | %ld (%.1f %%) | %.2f | %.2f | %.2f | %.2f | %.1f |\n", r.arm.c_str(),
                          r.batch_callers, r.interactive_calls, r.interactive_refused, pct, r.wait_p99_ms, r.p50_ms,
                          r.p99_ms, r.max_ms, r.batch_per_s);
            md << line.data();
        }
        return 0;
    } catch (const std::exception& error) {
        std::cerr << error.what() << '\n';
        return 1;
    }
}
