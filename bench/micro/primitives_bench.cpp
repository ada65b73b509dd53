// Reference points: the floor (a raw atomic decrement/increment pair),
// std::counting_semaphore, and a mutex + condition_variable semaphore.
// Every time is for one acquire + release.
#include "bench_support.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <semaphore>

namespace {

using bulkhead_bench::contention_report;
using bulkhead_bench::cv_semaphore;

// --- the floor --------------------------------------------------------------

alignas(64) std::atomic<std::int64_t> g_floor_word{std::int64_t{1} << 40};  // shared by all threads of a run

/// fetch_sub then fetch_add on one word, with the orderings
/// admission_counter uses (acquire to take, release to give back).
void atomic_pair(benchmark::State& state) {
    const auto pair = [] {
        g_floor_word.fetch_sub(1, std::memory_order_acquire);
        g_floor_word.fetch_add(1, std::memory_order_release);
    };
    if (state.threads() == 1) {
        for (auto _ : state) {
            pair();
        }
        bulkhead_bench::report_probe(state, pair);
        return;
    }
    static contention_report report;
    bulkhead_bench::run_scaling(state, report, pair);
}
BENCHMARK(atomic_pair)->Name("atomic_pair/fetch_sub_fetch_add")->Apply(bulkhead_bench::scaling);

// --- std::counting_semaphore --------------------------------------------------

std::optional<std::counting_semaphore<>> g_std_semaphore;  // (re)made by thread 0 before each run

/// Contended, acquire() is replaced by try_acquire_for(1 ms) in a loop: the
/// semaphore of libstdc++ 12 (GCC 12.2, as in Debian 12) can lose a wakeup
/// under contention and then acquire() sleeps forever (GCC bug 98033; seen
/// here with 16 threads). The timed wait turns a lost wakeup into a 1 ms
/// stall; the run reports how many waits timed out ("timeouts", timed loop
/// and fairness phase together).
void std_acquire_release(benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_std_semaphore.emplace(static_cast<std::ptrdiff_t>(state.range(0)));
    }
    if (state.threads() == 1) {
        for (auto _ : state) {
            g_std_semaphore->acquire();
            g_std_semaphore->release();
        }
        bulkhead_bench::report_probe(state, [] {
            g_std_semaphore->acquire();
            g_std_semaphore->release();
        });
        return;
    }
    static contention_report report;
    std::int64_t timeouts = 0;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between,
        [&] {
            while (!g_std_semaphore->try_acquire_for(std::chrono::milliseconds(1))) {
                ++timeouts;
            }
        },
        [] { g_std_semaphore->release(); });
    state.counters["timeouts"] = static_cast<double>(timeouts);
}
BENCHMARK(std_acquire_release)
    ->Name("std_counting_semaphore/acquire_release")
    ->Apply(bulkhead_bench::uncontended_semaphore);
BENCHMARK(std_acquire_release)->Name("std_counting_semaphore/acquire_release")->Apply(bulkhead_bench::contended);

// --- mutex + condition_variable ----------------------------------------------

std::optional<cv_semaphore> g_cv_semaphore;  // (re)made by thread 0 before each run

void cv_acquire_release(benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_cv_semaphore.emplace(state.range(0));
    }
    if (state.threads() == 1) {
        for (auto _ : state) {
            g_cv_semaphore->acquire();
            g_cv_semaphore->release();
        }
        bulkhead_bench::report_probe(state, [] {
            g_cv_semaphore->acquire();
            g_cv_semaphore->release();
        });
        return;
    }
    static contention_report report;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between, [] { g_cv_semaphore->acquire(); },
        [] { g_cv_semaphore->release(); });
}
BENCHMARK(cv_acquire_release)->Name("cv_semaphore/acquire_release")->Apply(bulkhead_bench::uncontended_semaphore);
BENCHMARK(cv_acquire_release)->Name("cv_semaphore/acquire_release")->Apply(bulkhead_bench::contended);

}  // namespace
