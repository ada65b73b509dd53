// bulkhead::fifo_semaphore and bulkhead::admission_counter: one acquire +
// release, uncontended and contended, for each way of acquiring.
#include "bench_support.hpp"

#include <bulkhead/admission_counter.hpp>
#include <bulkhead/fifo_semaphore.hpp>

#include <chrono>
#include <optional>
#include <stop_token>

namespace {

using namespace std::chrono_literals;
using bulkhead_bench::contention_report;

/// Long enough never to expire in a run: the timed path is measured, not the timeout.
constexpr auto never_expires = 10s;

std::optional<bulkhead::fifo_semaphore> g_fifo;  // (re)made by thread 0 before each run

void make_fifo(const benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_fifo.emplace(state.range(0));
    }
}

/// Records whether a timed or cancellable wait acquired, and fails the
/// benchmark if it did not (it cannot expire within a run).
void note_acquired(benchmark::State& state, bool& held, bool acquired) {
    held = acquired;
    if (!acquired) {
        state.SkipWithError("fifo_semaphore: a wait that cannot expire did not acquire");
    }
}

// --- untimed acquire ----------------------------------------------------------

void fifo_acquire_release(benchmark::State& state) {
    make_fifo(state);
    if (state.threads() == 1) {
        for (auto _ : state) {
            g_fifo->acquire();
            g_fifo->release();
        }
        bulkhead_bench::report_probe(state, [] {
            g_fifo->acquire();
            g_fifo->release();
        });
        return;
    }
    static contention_report report;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between, [] { g_fifo->acquire(); }, [] { g_fifo->release(); });
}
BENCHMARK(fifo_acquire_release)->Name("fifo_semaphore/acquire_release")->Apply(bulkhead_bench::uncontended_semaphore);
BENCHMARK(fifo_acquire_release)->Name("fifo_semaphore/acquire_release")->Apply(bulkhead_bench::contended);

// --- timed acquire --------------------------------------------------------------

void fifo_timed_acquire_release(benchmark::State& state) {
    make_fifo(state);
    if (state.threads() == 1) {
        for (auto _ : state) {
            bool acquired = g_fifo->try_acquire_for(never_expires);
            benchmark::DoNotOptimize(acquired);
            g_fifo->release();
        }
        bulkhead_bench::report_probe(state, [] {
            (void)g_fifo->try_acquire_for(never_expires);
            g_fifo->release();
        });
        return;
    }
    static contention_report report;
    bool held = false;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between,
        [&] { note_acquired(state, held, g_fifo->try_acquire_for(never_expires)); },
        [&] { g_fifo->release(held ? 1 : 0); });
}
BENCHMARK(fifo_timed_acquire_release)
    ->Name("fifo_semaphore/try_acquire_for_release")
    ->Apply(bulkhead_bench::uncontended_semaphore);
BENCHMARK(fifo_timed_acquire_release)->Name("fifo_semaphore/try_acquire_for_release")->Apply(bulkhead_bench::contended);

// --- timed acquire with a stop_token ---------------------------------------------

void fifo_cancellable_acquire_release(benchmark::State& state) {
    make_fifo(state);
    // One stop source per thread, as each request would have its own. Made
    // before the timed loop: a stop source allocates its shared state.
    const std::stop_source source;
    const std::stop_token token = source.get_token();
    if (state.threads() == 1) {
        for (auto _ : state) {
            bulkhead::wait_status status = g_fifo->try_acquire_for(never_expires, token);
            benchmark::DoNotOptimize(status);
            g_fifo->release();
        }
        bulkhead_bench::report_probe(state, [&] {
            (void)g_fifo->try_acquire_for(never_expires, token);
            g_fifo->release();
        });
        return;
    }
    static contention_report report;
    bool held = false;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between,
        [&] {
            note_acquired(state, held,
                          g_fifo->try_acquire_for(never_expires, token) == bulkhead::wait_status::acquired);
        },
        [&] { g_fifo->release(held ? 1 : 0); });
}
BENCHMARK(fifo_cancellable_acquire_release)
    ->Name("fifo_semaphore/try_acquire_for_stop_token_release")
    ->Apply(bulkhead_bench::uncontended_semaphore);
BENCHMARK(fifo_cancellable_acquire_release)
    ->Name("fifo_semaphore/try_acquire_for_stop_token_release")
    ->Apply(bulkhead_bench::contended);

// --- admission_counter ------------------------------------------------------------

std::optional<bulkhead::admission_counter> g_counter;  // (re)made by thread 0 before each run

/// try_acquire + release on a counter that always has room (the "admit" of
/// the gate). Never blocks, so no contention counters: the threaded runs show
/// how the one shared word scales.
void counter_acquire_release(benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_counter.emplace(bulkhead::admission_counter::max_capacity);
    }
    const auto admit_and_release = [] {
        bool admitted = g_counter->try_acquire();
        benchmark::DoNotOptimize(admitted);
        g_counter->release();
    };
    if (state.threads() == 1) {
        for (auto _ : state) {
            admit_and_release();
        }
        bulkhead_bench::report_probe(state, admit_and_release);
        return;
    }
    static contention_report report;
    bulkhead_bench::run_scaling(state, report, admit_and_release);
}
BENCHMARK(counter_acquire_release)->Name("admission_counter/try_acquire_release")->Apply(bulkhead_bench::scaling);

}  // namespace
