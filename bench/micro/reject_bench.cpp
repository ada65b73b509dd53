// The reject paths: a counter with no slot left, a semaphore with no permit,
// a gate that is full, through the throwing API (catching
// bulkhead::admission_full) and through the non-throwing one (try_enter,
// try_transaction returning reject_reason::admission_full).
//
// Each one also reports, from an untimed pass of the same call
// (report_probe), allocations, syscalls and context switches per rejection:
// the contract (A3) says the gate's reject path makes no syscall, takes no
// lock and allocates nothing.
#include "bench_support.hpp"

#include <bulkhead/admission_counter.hpp>
#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/fifo_semaphore.hpp>

#include <chrono>
#include <condition_variable>
#include <latch>
#include <memory>
#include <mutex>
#include <semaphore>
#include <stop_token>
#include <thread>

namespace {

using namespace std::chrono_literals;
using bulkhead_bench::do_nothing;
using bulkhead_bench::null_pool;
using gate_type = bulkhead::db_bulkhead<null_pool>;

// --- the building blocks, empty ------------------------------------------------

void counter_reject(benchmark::State& state) {
    bulkhead::admission_counter counter(0);
    for (auto _ : state) {
        bool admitted = counter.try_acquire();
        benchmark::DoNotOptimize(admitted);
    }
    bulkhead_bench::report_probe(state, [&] { (void)counter.try_acquire(); });
}
BENCHMARK(counter_reject)->Name("reject/admission_counter_try_acquire")->Apply(bulkhead_bench::one_thread);

void fifo_reject(benchmark::State& state) {
    bulkhead::fifo_semaphore semaphore(0);
    for (auto _ : state) {
        bool acquired = semaphore.try_acquire();
        benchmark::DoNotOptimize(acquired);
    }
    bulkhead_bench::report_probe(state, [&] { (void)semaphore.try_acquire(); });
}
BENCHMARK(fifo_reject)->Name("reject/fifo_semaphore_try_acquire")->Apply(bulkhead_bench::one_thread);

/// libstdc++ 12: try_acquire() on a zero count retries 16 times, the last 4
/// after sched_yield(); see bits/atomic_wait.h, __atomic_spin.
void std_reject(benchmark::State& state) {
    std::counting_semaphore<> semaphore(0);
    for (auto _ : state) {
        bool acquired = semaphore.try_acquire();
        benchmark::DoNotOptimize(acquired);
    }
    bulkhead_bench::report_probe(state, [&] { (void)semaphore.try_acquire(); });
}
BENCHMARK(std_reject)->Name("reject/std_counting_semaphore_try_acquire")->Apply(bulkhead_bench::one_thread);

void cv_reject(benchmark::State& state) {
    bulkhead_bench::cv_semaphore semaphore(0);
    for (auto _ : state) {
        bool acquired = semaphore.try_acquire();
        benchmark::DoNotOptimize(acquired);
    }
    bulkhead_bench::report_probe(state, [&] { (void)semaphore.try_acquire(); });
}
BENCHMARK(cv_reject)->Name("reject/cv_semaphore_try_acquire")->Apply(bulkhead_bench::one_thread);

// --- the gate, full ---------------------------------------------------------------

using full_gate = bulkhead_bench::full_gate<>;

// (Re)made by thread 0 before each run. A unique_ptr rather than an
// optional: GCC 12 warns (-Wmaybe-uninitialized, wrongly) about a jthread
// inside an optional.
std::unique_ptr<full_gate> g_full;

void make_full_gate(const benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_full.reset();
        g_full = std::make_unique<full_gate>();
    }
}

/// The full gate of this run. Precondition: make_full_gate() ran and the
/// timed loop has started (its barrier orders thread 0's emplace first).
gate_type& full() noexcept { return **g_full; }

template <class Result>
void expect_full(benchmark::State& state, const Result& outcome) {
    if (outcome || outcome.error() != bulkhead::reject_reason::admission_full) {
        state.SkipWithError("gate: expected admission_full");
    }
}

void gate_reject_throwing_enter(benchmark::State& state) {
    make_full_gate(state);
    const auto reject = [] {
        try {
            bulkhead::permit held = full().enter();
            benchmark::DoNotOptimize(held);
        } catch (const bulkhead::admission_full& full) {
            benchmark::DoNotOptimize(&full);
        }
    };
    for (auto _ : state) {
        reject();
    }
    bulkhead_bench::report_probe(state, reject);
}
BENCHMARK(gate_reject_throwing_enter)->Name("reject/gate_enter_throws")->Apply(bulkhead_bench::one_thread);

void gate_reject_throwing_transaction(benchmark::State& state) {
    make_full_gate(state);
    const auto reject = [] {
        try {
            full().transaction(0ms, do_nothing);
        } catch (const bulkhead::admission_full& full) {
            benchmark::DoNotOptimize(&full);
        }
    };
    for (auto _ : state) {
        reject();
    }
    bulkhead_bench::report_probe(state, reject);
}
BENCHMARK(gate_reject_throwing_transaction)->Name("reject/gate_transaction_throws")->Apply(bulkhead_bench::one_thread);

/// The non-throwing entry; also run from 2 to 64 threads at once: a full
/// gate is only read, so rejections should scale.
void gate_reject_try_enter(benchmark::State& state) {
    make_full_gate(state);
    const auto reject = [] {
        bulkhead::result<bulkhead::permit> outcome = full().try_enter();
        benchmark::DoNotOptimize(outcome);
    };
    if (state.threads() == 1) {
        for (auto _ : state) {
            reject();
        }
        bulkhead_bench::report_probe(state, reject);
    } else {
        static bulkhead_bench::contention_report report;
        bulkhead_bench::run_scaling(state, report, reject);
    }
    expect_full(state, full().try_enter());
}
BENCHMARK(gate_reject_try_enter)->Name("reject/gate_try_enter")->Apply(bulkhead_bench::scaling);

void gate_reject_try_transaction(benchmark::State& state) {
    make_full_gate(state);
    for (auto _ : state) {
        bulkhead::result<void> outcome = full().try_transaction(0ms, do_nothing);
        benchmark::DoNotOptimize(outcome);
    }
    expect_full(state, full().try_transaction(0ms, do_nothing));
    bulkhead_bench::report_probe(state, [] { (void)full().try_transaction(0ms, do_nothing); });
}
BENCHMARK(gate_reject_try_transaction)->Name("reject/gate_try_transaction")->Apply(bulkhead_bench::one_thread);

}  // namespace
