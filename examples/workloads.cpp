// Workload classes: a batch job and interactive requests through one gate.
//
// A gate of B = 4 over a pool of 4 serves two classes: `interactive`, with 2
// permits reserved for it, and `batch`, which may use the rest. Six batch
// threads keep long transactions queued (each waits 100 ms in the server, as
// a report's scan would) while one interactive caller makes 20 short calls,
// each allowed 50 ms for its permit. Every interactive call is served, at
// once, from its reservation; batch never runs more than the 2 shared
// permits. The plan is printed at start-up; the class figures at the end.
//
//   DB_URL='host=... dbname=... user=...' build/release/examples/workloads
//
// BULKHEAD_WORKLOADS, when set, replaces the built-in plan, as a service
// would read its budgets (docs/workloads.md has the format); it must keep
// the two classes, interactive and batch:
//
//   BULKHEAD_WORKLOADS='interactive reserved=1 queue=8; batch ceiling=2 queue=8' build/release/examples/workloads
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

int main() {
    const char* url = std::getenv("DB_URL");  // NOLINT(concurrency-mt-unsafe): before any thread starts
    if (url == nullptr) {
        std::cerr << "workloads: set DB_URL to a libpq connection string\n";
        return 2;
    }
    try {
        constexpr int permits = 4;
        const bulkhead::workload_plan plan = bulkhead::workloads_from_env().value_or(bulkhead::workload_plan{{
            {.name = "interactive", .reserved = 2, .queue = 8, .priority = 1},
            {.name = "batch", .queue = 8},
        }});
        std::cout << bulkhead::describe_workloads(plan, permits);
        bulkhead::pqxx_pool pool({.conninfo = url, .max_size = permits, .application_name = "bulkhead-workloads"});
        bulkhead::db_bulkhead gate(pool, {.concurrent = permits, .workloads = plan});
        const bulkhead::workload_id interactive = gate.workload("interactive");
        const bulkhead::workload_id batch = gate.workload("batch");

        std::atomic<bool> stop{false};
        std::atomic<int> batch_inside{0};
        std::atomic<int> batch_most{0};
        std::atomic<int> batch_started{0};
        std::vector<std::jthread> batch_threads;
        batch_threads.reserve(6);
        for (int i = 0; i < 6; ++i) {
            batch_threads.emplace_back([&] {
                while (!stop) {
                    (void)gate.try_transaction({.queue_wait = 5s, .workload = batch}, [&](pqxx::dbtransaction& tx) {
                        const int now = ++batch_inside;
                        int most = batch_most.load();
                        while (now > most && !batch_most.compare_exchange_weak(most, now)) {
                            // `most` now holds the current value: try again while ours is higher
                        }
                        ++batch_started;
                        tx.exec("SELECT pg_sleep(0.1)");
                        --batch_inside;
                    });
                }
            });
        }
        while (batch_started < permits) {  // batch holds its share before the first interactive call
            std::this_thread::sleep_for(1ms);
        }

        int served = 0;
        auto slowest = 0us;
        for (int i = 0; i < 20; ++i) {
            const auto started = std::chrono::steady_clock::now();
            const auto done = gate.try_transaction({.queue_wait = 50ms, .workload = interactive},
                                                   [](pqxx::dbtransaction& tx) { tx.exec("SELECT 1"); });
            if (done) {
                ++served;
                slowest = std::max(slowest, std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::steady_clock::now() - started));
            }
            std::this_thread::sleep_for(5ms);
        }
        stop = true;
        batch_threads.clear();  // joins

        const bulkhead::gate_stats stats = gate.stats();
        for (const bulkhead::workload_stats& one : stats.workloads) {
            std::cout << one.name << ": reserved=" << one.reserved << " ceiling=" << one.ceiling
                      << " admitted=" << one.admitted
                      << " timed_out=" << one.rejections(bulkhead::reject_reason::admission_timeout) << '\n';
        }
        std::cout << "interactive served=" << served << "/20 slowest_ms=" << static_cast<double>(slowest.count()) / 1e3
                  << '\n';
        std::cout << "batch most_inside=" << batch_most << '\n';
        const int reserved = gate.stats().workloads[0].reserved;
        const bool kept = served == 20 && batch_most <= permits - reserved && gate.available() == permits;
        std::cout << (kept ? "reservation kept" : "RESERVATION BROKEN") << '\n';
        return kept ? 0 : 1;
    } catch (const std::exception& failure) {
        std::cerr << "workloads: " << bulkhead::redact_conninfo(failure.what()) << '\n';
        return 1;
    }
}
