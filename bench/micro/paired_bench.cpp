// Paired measurements for the targets that are ratios. Two operations are
// timed in alternating blocks (A B, B A, A B, ...) inside one benchmark, and
// each is reported as its fastest block. A burst of load on a shared machine
// then slows both sides of a ratio alike, or is skipped over by the minimum,
// instead of landing on one side only (which separate benchmarks, minutes
// apart, cannot rule out).
//
// Counters: a_ns and b_ns (ns per operation, the fastest block of each),
// ratio = a_ns / b_ns, diff_ns = a_ns - b_ns.
#include "bench_support.hpp"

#include <bulkhead/admission_counter.hpp>
#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/fifo_semaphore.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <latch>
#include <limits>
#include <mutex>
#include <semaphore>
#include <stop_token>
#include <thread>

namespace {

using bulkhead_bench::now_ns;

/// Times `operations` calls of `operation`; returns ns per call.
template <class Operation>
double time_block(std::int64_t operations, Operation& operation) {
    const std::int64_t started = now_ns();
    for (std::int64_t i = 0; i < operations; ++i) {
        operation();
    }
    return static_cast<double>(now_ns() - started) / static_cast<double>(operations);
}

/// Each iteration is one round: a block of A and a block of B, in
/// alternating order. Reports the fastest block of each and their ratio.
template <class A, class B>
void paired(benchmark::State& state, std::int64_t block, A&& a, B&& b) {
    double best_a = std::numeric_limits<double>::max();
    double best_b = std::numeric_limits<double>::max();
    bool a_first = true;
    for (auto _ : state) {
        if (a_first) {
            best_a = std::min(best_a, time_block(block, a));
            best_b = std::min(best_b, time_block(block, b));
        } else {
            best_b = std::min(best_b, time_block(block, b));
            best_a = std::min(best_a, time_block(block, a));
        }
        a_first = !a_first;
    }
    state.counters["a_ns"] = best_a;
    state.counters["b_ns"] = best_b;
    state.counters["ratio"] = best_a / best_b;
    state.counters["diff_ns"] = best_a - best_b;
}

/// 200 rounds of two blocks: about 0.1 s for the fast pairs.
constexpr benchmark::IterationCount rounds = 200;

// --- fifo_semaphore vs std::counting_semaphore, uncontended --------------------

void fifo_vs_std(benchmark::State& state) {
    bulkhead::fifo_semaphore fifo(16);
    std::counting_semaphore<> standard(16);
    paired(
        state, 10'000,
        [&] {
            fifo.acquire();
            fifo.release();
        },
        [&] {
            standard.acquire();
            standard.release();
        });
}
BENCHMARK(fifo_vs_std)
    ->Name("paired/fifo_semaphore_vs_std_counting_semaphore")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

// --- admission_counter vs the raw atomic pair -----------------------------------

void counter_vs_atomic_pair(benchmark::State& state) {
    bulkhead::admission_counter counter(bulkhead::admission_counter::max_capacity);
    alignas(64) std::atomic<std::int64_t> word{std::int64_t{1} << 40};
    paired(
        state, 10'000,
        [&] {
            bool admitted = counter.try_acquire();
            benchmark::DoNotOptimize(admitted);
            counter.release();
        },
        [&] {
            word.fetch_sub(1, std::memory_order_acquire);
            word.fetch_add(1, std::memory_order_release);
        });
}
BENCHMARK(counter_vs_atomic_pair)
    ->Name("paired/admission_counter_vs_atomic_pair")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

// --- the gate's enter/leave vs the raw atomic pair (absolute figure: a_ns) -------

void gate_vs_atomic_pair(benchmark::State& state) {
    bulkhead_bench::null_pool pool;
    bulkhead::db_bulkhead<bulkhead_bench::null_pool> gate(pool, 1, 0);
    alignas(64) std::atomic<std::int64_t> word{std::int64_t{1} << 40};
    paired(
        state, 10'000, [&] { gate.enter().release(); },
        [&] {
            word.fetch_sub(1, std::memory_order_acquire);
            word.fetch_add(1, std::memory_order_release);
        });
}
BENCHMARK(gate_vs_atomic_pair)
    ->Name("paired/gate_enter_leave_vs_atomic_pair")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

// --- the non-throwing reject vs std::counting_semaphore::try_acquire on empty ----

/// A gate (B = 1, Q = 0) whose one permit a thread of its own holds.
template <class Observer = bulkhead::null_observer>
using held_gate = bulkhead_bench::full_gate<Observer>;

void reject_vs_std_try_acquire(benchmark::State& state) {
    held_gate<> full;
    std::counting_semaphore<> empty(0);
    // The std side costs about a microsecond a call: smaller blocks.
    paired(
        state, 200,
        [&] {
            bulkhead::result<bulkhead::permit> outcome = full->try_enter();
            benchmark::DoNotOptimize(outcome);
        },
        [&] {
            bool acquired = empty.try_acquire();
            benchmark::DoNotOptimize(acquired);
        });
}
BENCHMARK(reject_vs_std_try_acquire)
    ->Name("paired/gate_try_enter_reject_vs_std_try_acquire_empty")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

void transaction_reject_vs_std_try_acquire(benchmark::State& state) {
    held_gate<> full;
    std::counting_semaphore<> empty(0);
    paired(
        state, 200,
        [&] {
            bulkhead::result<void> outcome =
                full->try_transaction(std::chrono::nanoseconds(0), bulkhead_bench::do_nothing);
            benchmark::DoNotOptimize(outcome);
        },
        [&] {
            bool acquired = empty.try_acquire();
            benchmark::DoNotOptimize(acquired);
        });
}
BENCHMARK(transaction_reject_vs_std_try_acquire)
    ->Name("paired/gate_try_transaction_reject_vs_std_try_acquire_empty")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

// --- what the gate adds to a rejection: the counts and the observer -------------

// b is the floor of a rejection: admission_counter::try_acquire on a counter
// with no slot free (a load and a compare). a is the whole non-throwing
// rejection through the gate (default Observer, null_observer): the misuse
// checks, the counter, the rejection count and the (empty) observer call.
// diff_ns bounds from above what the always-on counters and the default
// observer cost per rejection.
void reject_vs_counter_reject(benchmark::State& state) {
    held_gate<> full;
    bulkhead::admission_counter empty(0);
    paired(
        state, 10'000,
        [&] {
            bulkhead::result<bulkhead::permit> outcome = full->try_enter();
            benchmark::DoNotOptimize(outcome);
        },
        [&] {
            bool admitted = empty.try_acquire();
            benchmark::DoNotOptimize(admitted);
        });
}
BENCHMARK(reject_vs_counter_reject)
    ->Name("paired/gate_try_enter_reject_vs_admission_counter_reject")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

/// An observer that does something with every rejection: counts it in a
/// plain member (no atomic), as a user's own statistics might.
struct counting_observer {
    std::uint64_t rejections = 0;
    void on_rejected(bulkhead::reject_reason /*reason*/) noexcept { ++rejections; }
};

// What an observer that is used costs next to the default one.
void counting_observer_vs_null(benchmark::State& state) {
    held_gate<counting_observer> observed;
    held_gate<> plain;
    paired(
        state, 10'000,
        [&] {
            bulkhead::result<bulkhead::permit> outcome = observed->try_enter();
            benchmark::DoNotOptimize(outcome);
        },
        [&] {
            bulkhead::result<bulkhead::permit> outcome = plain->try_enter();
            benchmark::DoNotOptimize(outcome);
        });
    benchmark::DoNotOptimize(observed->observer().rejections);
}
BENCHMARK(counting_observer_vs_null)
    ->Name("paired/gate_try_enter_reject_counting_observer_vs_null_observer")
    ->Iterations(rounds)
    ->Apply(bulkhead_bench::one_thread);

}  // namespace
