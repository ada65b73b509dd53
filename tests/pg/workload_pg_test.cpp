// Contract G1 and G2 against a real PostgreSQL: a batch class that saturates
// its share of a gate with long transactions (pg_sleep in the server, as a
// report's scan) while one interactive caller runs short ones. With
// interactive's reservation, every interactive call gets a permit and a
// connection at once, and batch never holds more than the shared permits; the
// same load through a plain gate of the same B is run beside it for the
// comparison the "workload:" line prints (.ci/run collects it).
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include <bulkhead/workload.hpp>

#include "catch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace bulkhead_test;
using clock_type = std::chrono::steady_clock;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

namespace {

constexpr int permits = 4;
constexpr int batch_callers = 6;
constexpr int interactive_calls = 40;

struct run_figures {
    int interactive_ok = 0;
    int interactive_refused = 0;
    std::chrono::microseconds interactive_worst{0};
    int batch_most_inside = 0;
    long batch_done = 0;
};

/// Batch callers keep `pg_sleep(0.2)` transactions queued for the whole run
/// while one interactive caller makes its calls, each allowed 100 ms.
run_figures batch_against_interactive(gate_t& gate, bulkhead::workload_id interactive, bulkhead::workload_id batch) {
    std::atomic<bool> stop{false};
    std::atomic<int> batch_inside{0};
    std::atomic<int> batch_most{0};
    std::atomic<long> batch_done{0};
    std::atomic<int> batch_started{0};
    std::vector<std::thread> callers;
    callers.reserve(batch_callers);
    for (int i = 0; i < batch_callers; ++i) {
        callers.emplace_back([&] {
            while (!stop.load()) {
                (void)gate.try_transaction({.queue_wait = 5s, .workload = batch}, [&](pqxx::dbtransaction& tx) {
                    raise_max(batch_most, batch_inside.fetch_add(1) + 1);
                    batch_started.fetch_add(1);
                    exec_one_row(tx, "SELECT pg_sleep(0.2)");
                    batch_inside.fetch_sub(1);
                });
                batch_done.fetch_add(1);
            }
        });
    }
    struct join_callers {
        std::atomic<bool>& stop;
        std::vector<std::thread>& callers;
        ~join_callers() {
            stop.store(true);
            for (std::thread& caller : callers) {
                caller.join();
            }
        }
    } joiner{stop, callers};
    // batch is saturating its share before the first interactive call.
    REQUIRE(eventually([&] { return batch_started.load() >= permits; }));
    run_figures figures;
    for (int i = 0; i < interactive_calls; ++i) {
        const auto started = clock_type::now();
        const auto done = gate.try_transaction({.queue_wait = 100ms, .workload = interactive},
                                               [](pqxx::dbtransaction& tx) { exec_one_row(tx, "SELECT 1"); });
        const auto took = std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - started);
        if (done) {
            ++figures.interactive_ok;
            figures.interactive_worst = std::max(figures.interactive_worst, took);
        } else {
            ++figures.interactive_refused;
        }
        std::this_thread::sleep_for(10ms);  // the interactive caller's think time: orders nothing
    }
    stop.store(true);
    for (std::thread& caller : callers) {
        caller.join();
    }
    callers.clear();
    figures.batch_most_inside = batch_most.load();
    figures.batch_done = batch_done.load();
    return figures;
}

}  // namespace

TEST_CASE("[G2] against PostgreSQL, a batch class saturating its share leaves interactive calls their reservation",
          "[pg][G2][G1]") {
    const bulkhead::workload_plan plan{{
        bulkhead::workload_class{.name = "interactive", .reserved = 2, .queue = 16, .priority = 1},
        bulkhead::workload_class{.name = "batch", .reserved = 0, .queue = 16},
    }};
    bulkhead::pqxx_pool pool(pool_options("bulkhead-workload-classes", permits));
    gate_t gate(pool, {.concurrent = permits, .workloads = plan});
    const run_figures classes = batch_against_interactive(gate, gate.workload("interactive"), gate.workload("batch"));

    bulkhead::pqxx_pool plain_pool(pool_options("bulkhead-workload-plain", permits));
    gate_t plain(plain_pool, permits, 2 * 16);
    const run_figures shared = batch_against_interactive(plain, bulkhead::workload_id{}, bulkhead::workload_id{});

    std::printf(
        "workload: B = %d, %d batch callers (pg_sleep 0.2 s), %d interactive calls (queue wait 100 ms): with "
        "classes (interactive reserves 2) %d served, %d refused, slowest %.1f ms, batch at most %d inside; one "
        "shared gate: %d served, %d refused, slowest served %.1f ms\n",
        permits, batch_callers, interactive_calls, classes.interactive_ok, classes.interactive_refused,
        static_cast<double>(classes.interactive_worst.count()) / 1e3, classes.batch_most_inside, shared.interactive_ok,
        shared.interactive_refused, static_cast<double>(shared.interactive_worst.count()) / 1e3);
    CHECK(classes.interactive_ok == interactive_calls);
    CHECK(classes.interactive_refused == 0);
    CHECK(classes.batch_most_inside <= permits - 2);  // G1: batch only ever had the shared permits
    CHECK(classes.batch_done > 0);
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.running == 0);
    CHECK(stats.available == permits);
    REQUIRE(stats.workloads.size() == 2);
    CHECK(stats.workloads[0].admitted == static_cast<std::uint64_t>(interactive_calls));
    CHECK(stats.workloads[0].rejections(bulkhead::reject_reason::admission_timeout) == 0);
}
